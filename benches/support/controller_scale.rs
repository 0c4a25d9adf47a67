//! The controller-at-scale harness, shared by `examples/controller_scale.rs` (the figures
//! in docs/performance.md) and `tests/cluster/scale.rs` (the write-count property at a small
//! size): a cluster of realistic root workloads seeded into kube-sim, a Prometheus stub
//! that answers the controller's PromQL with DCGM-shaped vectors, and the real
//! `gpu-reaper controller` binary run as a child process and measured from outside
//! (`/proc/<pid>`, its `/metrics`, its log, kube-sim's access log).
//!
//! The stub stands in for Prometheus on purpose: at 10,000 GPUs the real server spends
//! 13–15 s per cycle evaluating the subqueries (docs/performance.md, "Live telemetry
//! cycle"), which measures Prometheus, not the controller.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::PostParams;
use kube_sim::KubeSim;
use serde_json::{Value, json};

/// What to build and how to drive the controller.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Every pod in the cluster, GPU and CPU-only.
    pub pods: usize,
    /// Pods holding one GPU each (the rest claim none and must be ignored).
    pub gpu_pods: usize,
    /// Share of GPU workloads whose every GPU has been idle for `idle_minutes`.
    pub idle_fraction: f64,
    /// How long idle GPUs have been idle (past `warn.after` = 30 min: they get warned).
    pub idle_minutes: i64,
    /// `--interval` of the controller.
    pub interval: Duration,
    /// Evaluation cycles to measure before stopping the controller.
    pub cycles: usize,
    /// How long the Prometheus stub takes per answer. Zero for measurements; a test sets
    /// a few milliseconds so that a cycle outlasts the harness' 50 ms poll and each
    /// cycle is seen on its own (a 500-pod cycle takes ~30 ms).
    pub query_delay: Duration,
    /// The controller's `--history-backfill` (a Go duration, e.g. `168h`). When set, the
    /// policy is risk-gated (`idle.maxResumeRisk`), so cycle 1 backfills its idle-span
    /// history over that range from the stub; unset, nothing is backfilled.
    pub history_backfill: Option<String>,
}

impl Scenario {
    pub fn new(pods: usize, gpu_pods: usize) -> Self {
        Self {
            pods,
            gpu_pods: gpu_pods.min(pods),
            idle_fraction: 0.2,
            idle_minutes: 45,
            interval: Duration::from_secs(30),
            cycles: 4,
            query_delay: Duration::ZERO,
            history_backfill: None,
        }
    }

    /// The policy every GPU workload falls under: [`POLICY`], risk-gated when a backfill
    /// is asked for.
    pub fn policy(&self) -> String {
        match self.history_backfill {
            Some(_) => POLICY.replace(
                "minCoverage: 0.8}",
                "minCoverage: 0.8, maxResumeRisk: 0.05, history: 168h}",
            ),
            None => POLICY.to_string(),
        }
    }
}

/// The policy every GPU workload falls under. Enforce, so warnings are written on the
/// workloads themselves (the most writing mode). Workloads are seeded 6 hours old.
pub const POLICY: &str = r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: scale}
spec:
  mode: Enforce
  idle: {window: 30m, startupGrace: 20m, minCoverage: 0.8}
  warn: {after: 30m}
  action: {type: ScaleToZero, after: 60m, maxPerHour: 20}
"#;

/// One GPU as the DCGM exporter labels it, with the pod it is bound to.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub node: usize,
    pub index: usize,
    pub idle: bool,
}

impl Gpu {
    fn uuid(&self, serial: usize) -> String {
        format!(
            "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            0x5ca1e000u32 + self.node as u32,
            self.index,
            serial % 0xffff,
            0xd0c5,
            serial
        )
    }
}

/// Counts of the seeded objects, for the report.
#[derive(Debug, Clone, Default)]
pub struct Seeded {
    pub objects: usize,
    pub namespaces: usize,
    pub gpu_workloads: usize,
    pub idle_workloads: usize,
    pub gpus: Vec<Gpu>,
}

fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A pod shaped like one the kubelet reports: labels, owner, resources, env, mounts,
/// tolerations, conditions, container status. About 2.5 KiB of JSON before kube-sim adds
/// managedFields.
#[allow(clippy::too_many_arguments)]
fn pod(
    namespace: &str,
    name: &str,
    app: &str,
    owner: Option<(&str, &str, &str)>,
    gpus: u32,
    node: &str,
    phase: &str,
    created: &str,
) -> Value {
    let mut limits = json!({"cpu": "4", "memory": "16Gi"});
    if gpus > 0 {
        limits["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let image = if gpus > 0 {
        "nvcr.io/nvidia/pytorch:24.05-py3"
    } else {
        "registry.example.com/platform/api-server:1.42.7"
    };
    let mut metadata = json!({
        "name": name, "namespace": namespace, "creationTimestamp": created,
        "labels": {"app": app, "pod-template-hash": "7f9c5d8b6", "team": namespace, "tier": if gpus > 0 {"gpu"} else {"web"}},
        "annotations": {"kubectl.kubernetes.io/default-container": "main",
                        "prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
    });
    if let Some((api_version, kind, owner_name)) = owner {
        metadata["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind, "name": owner_name,
            "uid": format!("{kind}-{owner_name}"), "controller": true, "blockOwnerDeletion": true}]);
    }
    let running = phase == "Running";
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {
            "nodeName": node, "serviceAccountName": "default", "restartPolicy": if running {"Always"} else {"Never"},
            "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": true,
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c"], "args": ["exec /app/run --config /etc/app/config.yaml"],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "APP_NAME", "value": app}, {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "resources": {"limits": limits.clone(), "requests": limits},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/app"},
                                 {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
            }],
            "volumes": [{"name": "config", "configMap": {"name": format!("{app}-config"), "defaultMode": 420}},
                        {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        },
        "status": {
            "phase": phase, "hostIP": "10.0.3.17", "podIP": "10.244.17.33", "qosClass": "Guaranteed",
            "startTime": created,
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": created},
                {"type": "Initialized", "status": "True", "lastTransitionTime": created},
                {"type": "Ready", "status": if running {"True"} else {"False"}, "lastTransitionTime": created},
                {"type": "ContainersReady", "status": if running {"True"} else {"False"}, "lastTransitionTime": created},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": created}],
            "containerStatuses": [{
                "name": "main", "image": image, "imageID": format!("{image}@sha256:4f1c0e8d9a7b"),
                "containerID": "containerd://9b2f6c1d0e4a", "ready": running, "started": running, "restartCount": 0,
                "state": if running { json!({"running": {"startedAt": created}}) }
                         else { json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": created, "finishedAt": created}}) },
            }],
        },
    })
}

#[allow(clippy::too_many_arguments)]
fn owner_object(
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    owner: Option<(&str, &str, &str)>,
    replicas: Option<usize>,
    gpus: u32,
    created: &str,
) -> Value {
    let mut metadata = json!({"name": name, "namespace": namespace, "creationTimestamp": created,
        "labels": {"app": name, "team": namespace},
        "annotations": {"deployment.kubernetes.io/revision": "3"}});
    if let Some((av, k, n)) = owner {
        metadata["ownerReferences"] = json!([{"apiVersion": av, "kind": k, "name": n,
            "uid": format!("{k}-{n}"), "controller": true, "blockOwnerDeletion": true}]);
    }
    let mut resources = json!({"limits": {"cpu": "4", "memory": "16Gi"}});
    if gpus > 0 {
        resources["limits"]["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let template = json!({"metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3", "resources": resources}]}});
    let mut spec = json!({"selector": {"matchLabels": {"app": name}}, "template": template});
    if let Some(r) = replicas {
        spec["replicas"] = json!(r);
    }
    if kind == "Job" {
        spec = json!({"parallelism": replicas.unwrap_or(1), "completions": replicas.unwrap_or(1),
                      "template": {"spec": {"restartPolicy": "Never", "containers": template["spec"]["containers"].clone()}}});
    }
    if kind == "CronJob" {
        spec = json!({"schedule": "*/15 * * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": template["spec"]["containers"].clone()}}}}});
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec,
           "status": {"replicas": replicas.unwrap_or(0), "readyReplicas": replicas.unwrap_or(0)}})
}

/// Seeds `scenario.pods` pods grouped into root workloads. GPU pods (1 GPU each):
/// 40 % in Deployments of 4 replicas (Deployment → ReplicaSet, plus an old ReplicaSet at
/// 0 replicas), 35 % in Jobs of 4 pods, 10 % in StatefulSets of 2, the rest bare pods.
/// CPU-only pods: 60 % in Deployments of 10, 20 % completed Jobs of CronJobs, 10 %
/// DaemonSet pods, the rest bare. Workloads are spread over one namespace per 500 pods.
pub fn seed(sim: &KubeSim, scenario: &Scenario) -> Result<Seeded, kube_sim::ApiError> {
    let now = jiff::Timestamp::now();
    let created = rfc3339(now - jiff::SignedDuration::from_hours(6));
    let namespaces = (scenario.pods / 500).max(2);
    let mut out = Seeded {
        namespaces,
        ..Seeded::default()
    };
    let mut seed = |object: Value| -> Result<(), kube_sim::ApiError> {
        sim.seed(object)?;
        out.objects += 1;
        Ok(())
    };
    for ns in ["gpu-reaper"]
        .into_iter()
        .map(String::from)
        .chain((0..namespaces).map(ns_name))
    {
        seed(json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}))?;
    }
    let mut gpus = Vec::with_capacity(scenario.gpu_pods);
    let mut workloads = 0usize;
    let mut idle_workloads = 0usize;
    let idle_every = |w: usize| -> bool {
        // Spread the idle ones evenly: workload w is idle when the running share crosses
        // an integer.
        let f = scenario.idle_fraction;
        ((w + 1) as f64 * f).floor() > (w as f64 * f).floor()
    };
    let mut gpu_left = scenario.gpu_pods;
    let mut gpu_serial = 0usize;
    let shares = [
        (0.40, "Deployment", 4),
        (0.35, "Job", 4),
        (0.10, "StatefulSet", 2),
    ];
    let mut budgets: Vec<(&str, usize, usize)> = shares
        .iter()
        .map(|(s, k, r)| (*k, (scenario.gpu_pods as f64 * s) as usize, *r))
        .collect();
    let assigned: usize = budgets.iter().map(|b| b.1).sum();
    budgets.push(("Pod", scenario.gpu_pods - assigned, 1));
    for (kind, pods_of_kind, replicas) in budgets {
        let mut left = pods_of_kind.min(gpu_left);
        while left > 0 {
            let n = replicas.min(left);
            left -= n;
            gpu_left -= n;
            let ns = ns_name(workloads % namespaces);
            let idle = idle_every(workloads);
            workloads += 1;
            idle_workloads += usize::from(idle);
            let name = format!("{}-{workloads:05}", kind.to_lowercase());
            let pod_names: Pods = match kind {
                "Deployment" => {
                    let rs = format!("{name}-7f9c5d8b6");
                    seed(owner_object(
                        "apps/v1",
                        "Deployment",
                        &ns,
                        &name,
                        None,
                        Some(n),
                        1,
                        &created,
                    ))?;
                    seed(owner_object(
                        "apps/v1",
                        "ReplicaSet",
                        &ns,
                        &rs,
                        Some(("apps/v1", "Deployment", name.as_str())),
                        Some(n),
                        1,
                        &created,
                    ))?;
                    seed(owner_object(
                        "apps/v1",
                        "ReplicaSet",
                        &ns,
                        &format!("{name}-5b7d9c4f8"),
                        Some(("apps/v1", "Deployment", name.as_str())),
                        Some(0),
                        1,
                        &created,
                    ))?;
                    (0..n)
                        .map(|i| {
                            (
                                format!("{rs}-{i:05x}"),
                                Some(("apps/v1", "ReplicaSet", rs.clone())),
                            )
                        })
                        .collect()
                }
                "Job" => {
                    seed(owner_object(
                        "batch/v1",
                        "Job",
                        &ns,
                        &name,
                        None,
                        Some(n),
                        1,
                        &created,
                    ))?;
                    (0..n)
                        .map(|i| {
                            (
                                format!("{name}-{i}-x7k2p"),
                                Some(("batch/v1", "Job", name.clone())),
                            )
                        })
                        .collect()
                }
                "StatefulSet" => {
                    seed(owner_object(
                        "apps/v1",
                        "StatefulSet",
                        &ns,
                        &name,
                        None,
                        Some(n),
                        1,
                        &created,
                    ))?;
                    (0..n)
                        .map(|i| {
                            (
                                format!("{name}-{i}"),
                                Some(("apps/v1", "StatefulSet", name.clone())),
                            )
                        })
                        .collect()
                }
                _ => vec![(name.clone(), None)],
            };
            for (pod_name, owner) in pod_names {
                let node = gpu_serial / 8;
                let owner_ref = owner.as_ref().map(|(a, k, n)| (*a, *k, n.as_str()));
                seed(pod(
                    &ns,
                    &pod_name,
                    &name,
                    owner_ref,
                    1,
                    &format!("gpu-node-{node:04}"),
                    "Running",
                    &created,
                ))?;
                gpus.push(Gpu {
                    namespace: ns.clone(),
                    pod: pod_name,
                    container: "main".into(),
                    node,
                    index: gpu_serial % 8,
                    idle,
                });
                gpu_serial += 1;
            }
        }
    }
    let cpu_pods = scenario.pods - scenario.gpu_pods;
    let cpu_shares = [
        (0.60, "Deployment", 10),
        (0.20, "CronJob", 1),
        (0.10, "DaemonSet", 20),
    ];
    let mut budgets: Vec<(&str, usize, usize)> = cpu_shares
        .iter()
        .map(|(s, k, r)| (*k, (cpu_pods as f64 * s) as usize, *r))
        .collect();
    let assigned: usize = budgets.iter().map(|b| b.1).sum();
    budgets.push(("Pod", cpu_pods - assigned, 1));
    let mut cpu_workloads = 0usize;
    for (kind, pods_of_kind, replicas) in budgets {
        let mut left = pods_of_kind;
        while left > 0 {
            let n = replicas.min(left);
            left -= n;
            let ns = ns_name(cpu_workloads % namespaces);
            cpu_workloads += 1;
            let name = format!("svc-{}-{cpu_workloads:05}", kind.to_lowercase());
            let (pods, phase): (Pods, &str) = match kind {
                "Deployment" => {
                    let rs = format!("{name}-6d4b8c7f5");
                    seed(owner_object(
                        "apps/v1",
                        "Deployment",
                        &ns,
                        &name,
                        None,
                        Some(n),
                        0,
                        &created,
                    ))?;
                    seed(owner_object(
                        "apps/v1",
                        "ReplicaSet",
                        &ns,
                        &rs,
                        Some(("apps/v1", "Deployment", name.as_str())),
                        Some(n),
                        0,
                        &created,
                    ))?;
                    (
                        (0..n)
                            .map(|i| {
                                (
                                    format!("{rs}-{i:05x}"),
                                    Some(("apps/v1", "ReplicaSet", rs.clone())),
                                )
                            })
                            .collect(),
                        "Running",
                    )
                }
                "CronJob" => {
                    let job = format!("{name}-29412345");
                    seed(owner_object(
                        "batch/v1", "CronJob", &ns, &name, None, None, 0, &created,
                    ))?;
                    seed(owner_object(
                        "batch/v1",
                        "Job",
                        &ns,
                        &job,
                        Some(("batch/v1", "CronJob", name.as_str())),
                        Some(1),
                        0,
                        &created,
                    ))?;
                    (
                        vec![(
                            format!("{job}-q8w2z"),
                            Some(("batch/v1", "Job", job.clone())),
                        )],
                        "Succeeded",
                    )
                }
                "DaemonSet" => {
                    seed(owner_object(
                        "apps/v1",
                        "DaemonSet",
                        &ns,
                        &name,
                        None,
                        None,
                        0,
                        &created,
                    ))?;
                    (
                        (0..n)
                            .map(|i| {
                                (
                                    format!("{name}-{i:05x}"),
                                    Some(("apps/v1", "DaemonSet", name.clone())),
                                )
                            })
                            .collect(),
                        "Running",
                    )
                }
                _ => (vec![(name.clone(), None)], "Running"),
            };
            for (i, (pod_name, owner)) in pods.into_iter().enumerate() {
                let owner_ref = owner.as_ref().map(|(a, k, n)| (*a, *k, n.as_str()));
                seed(pod(
                    &ns,
                    &pod_name,
                    &name,
                    owner_ref,
                    0,
                    &format!("cpu-node-{:04}", (cpu_workloads + i) % 997),
                    phase,
                    &created,
                ))?;
            }
        }
    }
    out.gpu_workloads = workloads;
    out.idle_workloads = idle_workloads;
    out.gpus = gpus;
    Ok(out)
}

/// Pod names with their controller (apiVersion, kind, name).
type Pods<'a> = Vec<(String, Option<(&'a str, &'a str, String)>)>;

fn ns_name(i: usize) -> String {
    format!("team-{i:03}")
}

/// Installs the CRDs and the policy through the API (so the CRD schema defaults apply),
/// and RBAC for the controller's service account: everything (kube-sim records every
/// call a service account makes; the chart's own least-privilege RBAC is tested in
/// tests/cluster/helm.rs).
pub async fn install(sim: &KubeSim, policy: &str) -> Result<(), kube_sim::BoxError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let client = sim.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in gpu_reaper::api::crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let policy: gpu_reaper::api::GpuPolicy = serde_yaml::from_str(policy)?;
    Api::<gpu_reaper::api::GpuPolicy>::all(client)
        .create(&PostParams::default(), &policy)
        .await?;
    sim.seed(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "scale-harness"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}),
    )?;
    sim.seed(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "scale-harness"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "scale-harness"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpu-reaper-controller", "namespace": "gpu-reaper"}]}))?;
    Ok(())
}

/// A kubeconfig that makes the controller `system:serviceaccount:gpu-reaper:gpu-reaper-controller`,
/// so kube-sim records its every call.
pub fn service_account_kubeconfig(sim: &KubeSim, dir: &Path) -> PathBuf {
    let mut config: Value =
        serde_yaml::from_str(&std::fs::read_to_string(sim.kubeconfig_path()).unwrap()).unwrap();
    config["users"][0]["user"] =
        json!({"token": "system:serviceaccount:gpu-reaper:gpu-reaper-controller"});
    let path = dir.join("controller.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

// ---- the Prometheus stub ----

/// Answers the controller's PromQL (its live range reads, and the per-policy queries of
/// before, now in examples/live_cycle.rs) for every GPU,
/// with label sets like the DCGM exporter's (../shared/fixtures/dcgm/*query*.json), and
/// counts what it was asked.
pub struct PromStub {
    gpus: Vec<Gpu>,
    idle_seconds: i64,
    scrape_seconds: i64,
    pub queries: AtomicU64,
    pub bytes: AtomicU64,
    pub unknown: Mutex<Vec<String>>,
    /// Time taken per answer (see [`Scenario::query_delay`]).
    pub delay: Duration,
    /// Queries by the evaluation instant they asked about (`time`, whole seconds): one
    /// controller cycle evaluates every query at the same instant.
    pub by_time: Mutex<std::collections::BTreeMap<i64, u64>>,
    /// When the idle GPUs went idle (the stub's start less `idle_minutes`), so that
    /// every read agrees on each sample.
    pub idle_from: i64,
}

/// Every `[N s` duration in a query, in order (range, then subquery range and step).
fn durations(query: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for part in query.split(['[', ':']).skip(1) {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && part[digits.len()..].starts_with('s') {
            out.push(digits.parse().unwrap_or(0));
        }
    }
    out
}

enum Answer {
    /// `FAMILY[Ns]`: the raw samples of the range (the incremental read).
    Range(&'static str, i64),
    Count(i64),
    LastBusy,
    LastBlind(i64),
    FirstSample(i64),
    Latest(&'static str),
}

impl PromStub {
    pub fn new(gpus: Vec<Gpu>, idle_minutes: i64, scrape_seconds: i64) -> Self {
        Self {
            gpus,
            idle_seconds: idle_minutes * 60,
            scrape_seconds,
            queries: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            unknown: Mutex::new(Vec::new()),
            delay: Duration::ZERO,
            by_time: Mutex::new(std::collections::BTreeMap::new()),
            idle_from: jiff::Timestamp::now().as_second() - idle_minutes * 60,
        }
    }

    fn classify(&self, query: &str) -> Option<Answer> {
        let d = durations(query);
        for family in gpu_reaper::telemetry::live::FAMILIES {
            if let Some(range) = query.strip_prefix(family).filter(|r| r.starts_with('[')) {
                return Some(Answer::Range(family, *durations(range).first()?));
            }
        }
        if query.starts_with("count_over_time(") {
            return Some(Answer::Count(d.first()? / self.scrape_seconds));
        }
        if query.starts_with("max_over_time(timestamp(count_over_time(") {
            // Blind: the first windows after the exporter's series began (horizon ago).
            // The durations are the window (once per condition), then horizon and step.
            return Some(Answer::LastBlind(
                d.get(d.len().checked_sub(2)?)? - d.first()?,
            ));
        }
        if query.starts_with("max_over_time(timestamp(") && query.contains(">=") {
            return Some(Answer::LastBusy);
        }
        if query.starts_with("min_over_time(timestamp(") {
            return Some(Answer::FirstSample(*d.first()?));
        }
        if let Some(rest) = query.strip_prefix("last_over_time(") {
            for family in [
                "DCGM_FI_DEV_FB_USED",
                "DCGM_FI_PROF_PCIE_RX_BYTES",
                "DCGM_FI_DEV_POWER_USAGE",
            ] {
                if rest.starts_with(family) {
                    return Some(Answer::Latest(family));
                }
            }
        }
        None
    }

    /// The JSON answer to `query` evaluated at `time`.
    pub fn answer(&self, query: &str, time: f64) -> String {
        self.queries.fetch_add(1, Ordering::Relaxed);
        *self
            .by_time
            .lock()
            .unwrap()
            .entry(time.floor() as i64)
            .or_default() += 1;
        let Some(answer) = self.classify(query) else {
            self.unknown.lock().unwrap().push(query.to_string());
            return r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#.into();
        };
        let now = time.floor() as i64;
        if let Answer::Range(family, range) = answer {
            return self.range(family, now, range);
        }
        let minute = now / 60 * 60;
        let mut out = String::with_capacity(self.gpus.len() * 520 + 64);
        out.push_str(r#"{"status":"success","data":{"resultType":"vector","result":["#);
        let mut first = true;
        for (serial, gpu) in self.gpus.iter().enumerate() {
            let value = match answer {
                Answer::Range(..) => 0.0, // answered above
                Answer::Count(n) => n as f64,
                Answer::LastBusy if gpu.idle => (minute - self.idle_seconds) as f64,
                Answer::LastBusy => (minute - 60) as f64,
                Answer::LastBlind(ago) => (minute - ago) as f64,
                Answer::FirstSample(ago) => (minute - ago) as f64,
                Answer::Latest("DCGM_FI_DEV_FB_USED") if gpu.idle => 38_912.0,
                Answer::Latest("DCGM_FI_DEV_FB_USED") => 61_440.0,
                Answer::Latest("DCGM_FI_PROF_PCIE_RX_BYTES") if gpu.idle => 12_288.0,
                Answer::Latest("DCGM_FI_PROF_PCIE_RX_BYTES") => 2.1e9,
                Answer::Latest(_) if gpu.idle => 71.5,
                Answer::Latest(_) => 612.3,
            };
            if !first {
                out.push(',');
            }
            first = false;
            let _ = write!(
                out,
                r#"{{"metric":{{"DCGM_FI_DRIVER_VERSION":"580.105.08","Hostname":"gpu-node-{node:04}","UUID":"{uuid}","container":"{container}","device":"nvidia{index}","endpoint":"gpu-metrics","gpu":"{index}","instance":"10.0.{hi}.{lo}:9400","job":"nvidia-dcgm-exporter","modelName":"NVIDIA H100 80GB HBM3","namespace":"{ns}","pci_bus_id":"00000000:{bus:02X}:00.0","pod":"{pod}","service":"nvidia-dcgm-exporter"}},"value":[{time:.3},"{value}"]}}"#,
                node = gpu.node,
                uuid = gpu.uuid(serial),
                container = gpu.container,
                index = gpu.index,
                hi = gpu.node / 250,
                lo = gpu.node % 250,
                ns = gpu.namespace,
                bus = 0x18 + gpu.index * 0x11,
                pod = gpu.pod,
            );
        }
        out.push_str("]}}");
        self.bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }

    /// The matrix answer to `family[range s]` at `now`: a sample per scrape in the
    /// range, for every GPU (H100s: no DCGM_FI_DEV_GPU_UTIL series).
    fn range(&self, family: &str, now: i64, range: i64) -> String {
        let times: Vec<i64> = ((now - range).div_euclid(self.scrape_seconds) + 1
            ..=now.div_euclid(self.scrape_seconds))
            .map(|k| k * self.scrape_seconds)
            .filter(|t| *t > now - range)
            .collect();
        let mut out = String::with_capacity(self.gpus.len() * (520 + 24 * times.len()) + 64);
        out.push_str(r#"{"status":"success","data":{"resultType":"matrix","result":["#);
        if family == "DCGM_FI_DEV_GPU_UTIL" {
            out.push_str("]}}");
            return out;
        }
        for (serial, gpu) in self.gpus.iter().enumerate() {
            if serial > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                r#"{{"metric":{{"__name__":"{family}","DCGM_FI_DRIVER_VERSION":"580.105.08","Hostname":"gpu-node-{node:04}","UUID":"{uuid}","container":"{container}","device":"nvidia{index}","endpoint":"gpu-metrics","gpu":"{index}","instance":"10.0.{hi}.{lo}:9400","job":"nvidia-dcgm-exporter","modelName":"NVIDIA H100 80GB HBM3","namespace":"{ns}","pci_bus_id":"00000000:{bus:02X}:00.0","pod":"{pod}","service":"nvidia-dcgm-exporter"}},"values":["#,
                node = gpu.node,
                uuid = gpu.uuid(serial),
                container = gpu.container,
                index = gpu.index,
                hi = gpu.node / 250,
                lo = gpu.node % 250,
                ns = gpu.namespace,
                bus = 0x18 + gpu.index * 0x11,
                pod = gpu.pod,
            );
            for (i, &t) in times.iter().enumerate() {
                let idle = gpu.idle && t >= self.idle_from;
                let value = match family {
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE" if idle => 0.0,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => 0.6,
                    "DCGM_FI_DEV_FB_USED" if gpu.idle => 38_912.0,
                    "DCGM_FI_DEV_FB_USED" => 61_440.0,
                    "DCGM_FI_PROF_PCIE_RX_BYTES" if idle => 12_288.0,
                    "DCGM_FI_PROF_PCIE_RX_BYTES" => 2.1e9,
                    _ if idle => 71.5,
                    _ => 612.3,
                };
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, r#"[{t},"{value}"]"#);
            }
            out.push_str("]}");
        }
        out.push_str("]}}");
        self.bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
        out
    }
}

/// Serves the stub on a loopback port (POST form or GET query string, as
/// prometheus-http-query and curl send them); returns its base URL.
pub async fn serve_stub(stub: Arc<PromStub>) -> String {
    use axum::body::Bytes;
    use axum::extract::{RawQuery, State};
    use axum::routing::post;
    async fn query(
        State(stub): State<Arc<PromStub>>,
        RawQuery(raw): RawQuery,
        body: Bytes,
    ) -> ([(&'static str, &'static str); 1], String) {
        let mut q = String::new();
        let mut time = jiff::Timestamp::now().as_second() as f64;
        let pairs = url::form_urlencoded::parse(&body).chain(url::form_urlencoded::parse(
            raw.as_deref().unwrap_or("").as_bytes(),
        ));
        for (k, v) in pairs {
            match k.as_ref() {
                "query" => q = v.into_owned(),
                "time" => time = v.parse().unwrap_or(time),
                _ => {}
            }
        }
        let stub = stub.clone();
        tokio::time::sleep(stub.delay).await;
        let body = tokio::task::spawn_blocking(move || stub.answer(&q, time))
            .await
            .unwrap_or_default();
        ([("content-type", "application/json")], body)
    }
    let app = axum::Router::new()
        .route("/api/v1/query", post(query).get(query))
        .with_state(stub);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}

// ---- measuring the controller ----

/// CPU time (user + system) of a process, seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state (field 3).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after the state.
    (ticks(11) + ticks(12)) / 100.0
}

/// The descendant of `parent` that runs `bin` (a wrapper's child), waiting up to 10 s for
/// it; `parent` itself when none shows up.
async fn wrapped_pid(parent: u32, bin: &Path) -> u32 {
    let bin = std::fs::canonicalize(bin).unwrap_or_else(|_| bin.to_path_buf());
    let ppid = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    for _ in 0..200 {
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let mut up = Some(pid);
            let mut below = false;
            while let Some(p) = up.filter(|&p| p > 1) {
                if p == parent {
                    below = pid != parent;
                    break;
                }
                up = ppid(p);
            }
            if below && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == bin) {
                return pid;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    parent
}

/// (VmRSS, VmHWM) of a process, MiB.
pub fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `gpu_reaper_evaluation_duration_seconds` (count, sum) from the controller's /metrics.
async fn evaluations(port: u16) -> Option<(u64, f64)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.ok()?;
    let value = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((
        value("gpu_reaper_evaluation_duration_seconds_count")? as u64,
        value("gpu_reaper_evaluation_duration_seconds_sum")?,
    ))
}

/// API calls the controller made, by kind of call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Calls {
    /// Writes on workloads (patches of annotations, /scale, suspend, evictions).
    pub workload_writes: usize,
    /// Events created or patched.
    pub event_writes: usize,
    /// GpuPolicy status applies.
    pub status_writes: usize,
    /// Lease renewals (on their own clock, not per cycle).
    pub lease_writes: usize,
    /// Other writes (the Audit-mode ConfigMap).
    pub other_writes: usize,
    /// Gets and lists (watches excluded).
    pub reads: usize,
    /// The workload writes, as "verb resource namespace/name".
    pub workload_write_list: Vec<String>,
}

impl Calls {
    fn of(accesses: &[kube_sim::rbac::Access]) -> Self {
        let mut c = Calls::default();
        for a in accesses {
            match a.verb.as_str() {
                "get" | "list" => c.reads += 1,
                "watch" => {}
                _ if a.resource == "leases" => c.lease_writes += 1,
                _ if a.resource == "events" => c.event_writes += 1,
                _ if a.resource == "gpupolicies/status" => c.status_writes += 1,
                _ if a.resource == "configmaps" => c.other_writes += 1,
                _ => {
                    c.workload_writes += 1;
                    c.workload_write_list.push(format!(
                        "{} {} {}/{}",
                        a.verb, a.resource, a.namespace, a.name
                    ));
                }
            }
        }
        c
    }
}

/// One evaluation cycle, seen from outside.
#[derive(Debug, Clone)]
pub struct Cycle {
    /// Wall time inside the cycle (the controller's histogram).
    pub wall_seconds: f64,
    /// CPU time of the process over the cycle.
    pub cpu_seconds: f64,
    pub rss_mib: f64,
    pub prometheus_queries: u64,
    pub prometheus_bytes: u64,
    pub calls: Calls,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    pub pods: usize,
    pub gpu_pods: usize,
    pub gpu_workloads: usize,
    pub idle_workloads: usize,
    pub seed_seconds: f64,
    /// Process start → every watch listed ("watches synced").
    pub sync_seconds: f64,
    /// CPU spent until synced.
    pub sync_cpu_seconds: f64,
    /// Process start → the end of the first evaluation.
    pub first_cycle_done_seconds: f64,
    pub rss_after_sync_mib: f64,
    pub peak_rss_mib: f64,
    pub steady_rss_mib: f64,
    pub cycles: Vec<Cycle>,
    /// API calls until synced.
    pub sync_calls: Calls,
    /// Log lines at warn level or above, first few.
    pub warnings: Vec<String>,
    pub unknown_queries: Vec<String>,
    /// Queries per evaluation instant, in time order (one entry per controller cycle).
    pub queries_by_instant: Vec<u64>,
}

#[derive(Default)]
struct LogMarks {
    synced: Option<(Instant, f64, f64)>,
    warnings: Vec<String>,
    lines: usize,
}

/// Seeds a kube-sim, serves the stub, runs `bin controller` against both and measures
/// `scenario.cycles` evaluations. `log` receives progress lines.
pub async fn run(
    bin: &Path,
    scenario: &Scenario,
    log: &dyn Fn(&str),
) -> Result<Measured, kube_sim::BoxError> {
    let sim = KubeSim::start_with(kube_sim::Options {
        history_limit: 10_000,
        ..Default::default()
    })
    .await?;
    install(&sim, &scenario.policy()).await?;
    let started = Instant::now();
    let seeded = seed(&sim, scenario)?;
    let seed_seconds = started.elapsed().as_secs_f64();
    log(&format!(
        "seeded {} objects ({} pods, {} GPU pods in {} GPU workloads, {} idle) in {:.1} s",
        seeded.objects,
        scenario.pods,
        scenario.gpu_pods,
        seeded.gpu_workloads,
        seeded.idle_workloads,
        seed_seconds
    ));
    let stub = Arc::new(PromStub {
        delay: scenario.query_delay,
        ..PromStub::new(seeded.gpus.clone(), scenario.idle_minutes, 30)
    });
    let prometheus = serve_stub(stub.clone()).await;
    let dir = tempfile::tempdir()?;
    let kubeconfig = service_account_kubeconfig(&sim, dir.path());
    let metrics_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let baseline = sim.accesses().len();
    let interval = format!("{}ms", scenario.interval.as_millis());
    let spawned = Instant::now();
    // SCALE_CONTROLLER_WRAPPER="heaptrack -o /tmp/c" (split on whitespace) runs the
    // controller under a profiler; the measured pid is then the controller found below
    // the wrapper, not the wrapper itself.
    let wrapper: Vec<String> = std::env::var("SCALE_CONTROLLER_WRAPPER")
        .map(|w| w.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child: Child = command
        .args(["--log-format", "json", "controller"])
        .args(["--prometheus-url", &prometheus])
        .args(["--interval", &interval, "--scrape-interval", "30s"])
        .args(["--listen", &format!("127.0.0.1:{metrics_port}")])
        .args(
            scenario
                .history_backfill
                .iter()
                .flat_map(|b| ["--history-backfill", b.as_str()]),
        )
        .args([
            "--lease-namespace",
            "gpu-reaper",
            "--identity",
            "scale-harness",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        // As the chart's controller Deployment runs it (helm/gpu-reaper/templates/controller.yaml).
        .env(
            "MIMALLOC_PURGE_DELAY",
            std::env::var("MIMALLOC_PURGE_DELAY").unwrap_or_else(|_| "0".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = if wrapper.is_empty() {
        child.id()
    } else {
        wrapped_pid(child.id(), bin).await
    };
    let marks = Arc::new(Mutex::new(LogMarks::default()));
    {
        let marks = marks.clone();
        let stderr = child.stderr.take().unwrap();
        // SCALE_CONTROLLER_LOG=<file> keeps the controller's log.
        let mut keep =
            std::env::var_os("SCALE_CONTROLLER_LOG").and_then(|p| std::fs::File::create(p).ok());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(f) = keep.as_mut() {
                    use std::io::Write as _;
                    let _ = writeln!(f, "{line}");
                }
                let mut m = marks.lock().unwrap();
                m.lines += 1;
                if m.synced.is_none() && line.contains("\"watches synced\"") {
                    m.synced = Some((Instant::now(), cpu_seconds(pid), rss_mib(pid).0));
                }
                if (line.contains("\"level\":\"WARN\"") || line.contains("\"level\":\"ERROR\""))
                    && m.warnings.len() < 20
                {
                    m.warnings.push(line);
                }
            }
        });
    }
    let mut result = measure(
        &sim,
        &stub,
        &mut child,
        pid,
        metrics_port,
        scenario,
        spawned,
        baseline,
        &marks,
        log,
    )
    .await;
    if !wrapper.is_empty() {
        // Let the controller exit on its own so the profiler writes its output.
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        for _ in 0..600 {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    if let Ok(m) = &mut result {
        m.seed_seconds = seed_seconds;
        m.gpu_workloads = seeded.gpu_workloads;
        m.idle_workloads = seeded.idle_workloads;
        m.warnings = marks.lock().unwrap().warnings.clone();
        m.unknown_queries = stub.unknown.lock().unwrap().clone();
        m.queries_by_instant = stub.by_time.lock().unwrap().values().copied().collect();
    }
    sim.stop().await;
    result
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    sim: &KubeSim,
    stub: &PromStub,
    child: &mut Child,
    pid: u32,
    metrics_port: u16,
    scenario: &Scenario,
    spawned: Instant,
    baseline: usize,
    marks: &Mutex<LogMarks>,
    log: &dyn Fn(&str),
) -> Result<Measured, kube_sim::BoxError> {
    // CPU samples (time, seconds) to find each cycle's start from its duration.
    let mut samples: Vec<(Instant, f64)> = Vec::new();
    let mut seen = 0u64;
    let mut last_sum = 0.0;
    let mut last_queries = 0u64;
    let mut last_bytes = 0u64;
    let mut last_access = baseline;
    let mut cycles = Vec::new();
    let mut first_done = 0.0;
    let mut sync_calls = Calls::default();
    let mut peak = 0.0f64;
    let mut synced = false;
    let deadline = spawned + Duration::from_secs(600) + scenario.interval * scenario.cycles as u32;
    while cycles.len() < scenario.cycles {
        if let Some(status) = child.try_wait()? {
            return Err(format!("the controller exited early: {status}").into());
        }
        if Instant::now() > deadline {
            return Err("no evaluation within the deadline".into());
        }
        let now = Instant::now();
        samples.push((now, cpu_seconds(pid)));
        if !synced && marks.lock().unwrap().synced.is_some() {
            // Calls until the watches synced are the sync's (within one poll).
            synced = true;
            let accesses = sim.accesses();
            sync_calls = Calls::of(&accesses[baseline..]);
            last_access = accesses.len();
        }
        peak = peak.max(rss_mib(pid).1);
        if let Some((count, sum)) = evaluations(metrics_port).await
            && count > seen
        {
            let cpu_now = cpu_seconds(pid);
            let wall = sum - last_sum;
            let began = Instant::now()
                .checked_sub(Duration::from_secs_f64(wall) + Duration::from_millis(60))
                .unwrap_or(spawned);
            let cpu_before = samples
                .iter()
                .rev()
                .find(|(t, _)| *t <= began)
                .map_or(0.0, |s| s.1);
            let accesses = sim.accesses();
            if seen == 0 {
                first_done = spawned.elapsed().as_secs_f64();
            }
            let calls = Calls::of(&accesses[last_access..]);
            last_access = accesses.len();
            let queries = stub.queries.load(Ordering::Relaxed);
            let bytes = stub.bytes.load(Ordering::Relaxed);
            let cycle = Cycle {
                wall_seconds: wall,
                cpu_seconds: cpu_now - cpu_before,
                rss_mib: rss_mib(pid).0,
                prometheus_queries: queries - last_queries,
                prometheus_bytes: bytes - last_bytes,
                calls,
            };
            log(&format!(
                "cycle {}: {:.2} s wall, {:.2} s CPU, RSS {:.0} MiB, {} queries ({:.1} MB), {} workload writes, {} events, {} status, {} reads",
                cycles.len() + 1,
                cycle.wall_seconds,
                cycle.cpu_seconds,
                cycle.rss_mib,
                cycle.prometheus_queries,
                cycle.prometheus_bytes as f64 / 1e6,
                cycle.calls.workload_writes,
                cycle.calls.event_writes,
                cycle.calls.status_writes,
                cycle.calls.reads,
            ));
            cycles.push(cycle);
            (seen, last_sum, last_queries, last_bytes) = (count, sum, queries, bytes);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak = peak.max(rss_mib(pid).1);
    let m = marks.lock().unwrap();
    let (synced_at, sync_cpu, rss_after_sync) = m
        .synced
        .map(|(t, cpu, rss)| ((t - spawned).as_secs_f64(), cpu, rss))
        .unwrap_or_default();
    let mut sorted: Vec<f64> = cycles.iter().skip(1).map(|c| c.rss_mib).collect();
    sorted.sort_by(f64::total_cmp);
    Ok(Measured {
        pods: scenario.pods,
        gpu_pods: scenario.gpu_pods,
        gpu_workloads: 0,
        idle_workloads: 0,
        seed_seconds: 0.0,
        sync_seconds: synced_at,
        sync_cpu_seconds: sync_cpu,
        first_cycle_done_seconds: first_done,
        rss_after_sync_mib: rss_after_sync,
        peak_rss_mib: peak,
        steady_rss_mib: sorted.last().copied().unwrap_or(0.0),
        cycles,
        sync_calls,
        warnings: Vec::new(),
        unknown_queries: Vec::new(),
        queries_by_instant: Vec::new(),
    })
}

/// Writes per cycle as one map, for tests: cycle number → workload writes.
pub fn workload_writes(m: &Measured) -> BTreeMap<usize, Vec<String>> {
    m.cycles
        .iter()
        .enumerate()
        .map(|(i, c)| (i + 1, c.calls.workload_write_list.clone()))
        .collect()
}
