//! `gpu-reaper audit`: a read-only waste report of the last hours. It replays the history
//! Prometheus holds through the engine with a warn-only copy of the policy (nothing is
//! "reclaimed", so every idle hour is counted) and sums by namespace and workload. PURE:
//! attribution, summary, the readiness checklist and rendering; the command's edge (Prometheus,
//! the API server) is `commands::audit`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::Serialize;

use crate::api::policy::{ActionType, PolicyMode};
use crate::backtest::{self, Backtest, BacktestOptions};
use crate::cluster::inventory::{PodInfo, Workload};
use crate::error::Result;
use crate::report::OutputFormat;
use crate::telemetry::trace::{PodRecord, Trace};

/// Waste of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct NamespaceWaste {
    pub namespace: String,
    pub workloads: usize,
    pub gpus: u32,
    pub gpu_hours: f64,
    /// Share of held GPU-hours classified Active.
    pub active_share: f64,
    /// Idle GPU-hours by shape (`MemoryHeld`, `Unused`, `Provisioning`, `DataStarved`).
    pub idle_gpu_hours_by_shape: BTreeMap<String, f64>,
    pub idle_gpu_hours: f64,
    /// GPU-hours without enough telemetry to judge.
    pub no_telemetry_gpu_hours: f64,
    pub idle_usd: f64,
}

/// One offender.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Offender {
    pub namespace: String,
    pub kind: String,
    pub name: String,
    pub gpus: u32,
    pub classification: String,
    pub idle_gpu_hours: f64,
    pub idle_usd: f64,
}

/// The audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Audit {
    pub start: jiff::Timestamp,
    pub end: jiff::Timestamp,
    pub namespaces: Vec<NamespaceWaste>,
    pub top_offenders: Vec<Offender>,
    pub total: NamespaceWaste,
    pub unallocated_gpus: usize,
    /// How pods were attributed to workloads when the API server was asked (`--kubeconfig`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attribution: Option<Attribution>,
}

/// Where the workload of each GPU pod in the trace came from, with `--kubeconfig`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Attribution {
    /// Pods whose root workload the API server resolved (its owner chain, through any
    /// watched kind: Deployments, Jobs, Notebooks, RayClusters, …).
    pub api_server: usize,
    /// Of those, pods kube-state-metrics had not recorded at all (DCGM series only).
    pub not_in_kube_state_metrics: usize,
    /// Pods the API server no longer has (deleted since): attributed from
    /// kube-state-metrics as recorded, or as bare pods without it.
    pub gone: usize,
}

/// Pure: attributes the trace's GPU pods to the root workloads the API server resolved.
/// A pod kube-state-metrics recorded gets its owner replaced by the root (which may be a
/// kind kube-state-metrics cannot follow, such as a Notebook above its StatefulSet); a
/// pod only DCGM saw is added with the API server's labels, creation time and GPUs.
/// Pods the API server does not know keep what the trace says.
pub fn attribute(trace: &mut Trace, workloads: &[Workload]) -> Attribution {
    use crate::api::keys::ksm_sanitize;
    let mut roots: HashMap<(&str, &str), (&Workload, &PodInfo)> = HashMap::new();
    for w in workloads {
        for p in &w.pods {
            roots.insert((&p.meta.namespace, &p.meta.name), (w, p));
        }
    }
    let owner_of = |w: &Workload, p: &PodInfo| {
        (w.root.key() != p.meta.key()).then(|| (w.root.kind.clone(), w.root.name.clone()))
    };
    let mut out = Attribution::default();
    let mut known: HashSet<(String, String)> = HashSet::new();
    for record in &mut trace.pods {
        if record.gpu_devices() == 0 {
            continue;
        }
        known.insert((record.namespace.clone(), record.name.clone()));
        match roots.get(&(record.namespace.as_str(), record.name.as_str())) {
            Some((w, p)) => {
                record.owner = owner_of(w, p);
                out.api_server += 1;
            }
            None => out.gone += 1,
        }
    }
    // Pods seen only through their DCGM series, with the buckets they have samples in.
    let mut spans: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
    for g in &trace.gpus {
        if g.gpu.pod.is_empty() {
            continue;
        }
        let key = (g.gpu.namespace.clone(), g.gpu.pod.clone());
        if known.contains(&key) {
            continue;
        }
        if let Some((a, b)) = g.engine_active.span().or(g.gpu_util.span()) {
            let span = spans.entry(key).or_insert((a, b));
            *span = (span.0.min(a), span.1.max(b));
        }
    }
    for ((namespace, name), (first, last)) in spans {
        let Some((w, p)) = roots.get(&(namespace.as_str(), name.as_str())) else {
            out.gone += 1;
            continue;
        };
        // kube-state-metrics' key spelling, plus gpu-reaper's own keys as they are.
        let ksm = |map: &BTreeMap<String, String>| {
            let mut out = BTreeMap::new();
            for (k, v) in map {
                out.insert(ksm_sanitize(k), v.clone());
                if k.starts_with("gpureaper.io/") {
                    out.insert(k.clone(), v.clone());
                }
            }
            out
        };
        trace.pods.push(PodRecord {
            namespace: namespace.clone(),
            name: name.clone(),
            created: Some(p.meta.created_at.as_second()),
            owner: owner_of(w, p),
            labels: ksm(&p.meta.labels),
            annotations: ksm(&p.meta.annotations),
            gpu_requests: BTreeMap::from([(
                "(api server)".to_string(),
                p.gpus.ceil().max(1.0) as u32,
            )]),
            first_bucket: first,
            last_bucket: last,
            ..PodRecord::default()
        });
        out.api_server += 1;
        out.not_in_kube_state_metrics += 1;
    }
    out
}

/// Pure: the audit of `trace` under the idle rules and prices of `spec`.
pub fn audit(spec: &crate::api::GpuPolicySpec, trace: &Trace, top: usize) -> Audit {
    let mut warn_only = spec.clone();
    warn_only.mode = PolicyMode::Audit;
    warn_only.action.type_ = ActionType::None;
    let replay = backtest::run(
        "audit",
        &warn_only,
        trace,
        &BacktestOptions {
            regret_horizon: jiff::SignedDuration::ZERO,
            keep_timelines: false,
            warmup: jiff::SignedDuration::ZERO,
            history_backfill: crate::backtest::CONTROLLER_BACKFILL,
        },
    );
    summarise(&replay, top)
}

fn summarise(b: &Backtest, top: usize) -> Audit {
    let mut by_ns: BTreeMap<&str, NamespaceWaste> = BTreeMap::new();
    let mut total = NamespaceWaste {
        namespace: "(all)".into(),
        ..NamespaceWaste::default()
    };
    for w in &b.workloads {
        for ns in [
            by_ns.entry(&w.namespace).or_insert_with(|| NamespaceWaste {
                namespace: w.namespace.clone(),
                ..NamespaceWaste::default()
            }),
            &mut total,
        ] {
            ns.workloads += 1;
            ns.gpus += w.gpus;
            ns.idle_gpu_hours += w.idle_gpu_hours;
            ns.idle_usd += w.idle_usd;
            for (class, hours) in &w.gpu_hours_by_class {
                ns.gpu_hours += hours;
                if let Some(shape) = class.strip_prefix("Idle/") {
                    *ns.idle_gpu_hours_by_shape
                        .entry(shape.to_string())
                        .or_default() += hours;
                } else if class == "Active" {
                    ns.active_share += hours; // hours for now; divided below
                } else if class == "NoTelemetry" {
                    ns.no_telemetry_gpu_hours += hours;
                }
            }
        }
    }
    let mut namespaces: Vec<NamespaceWaste> = by_ns.into_values().collect();
    for ns in namespaces.iter_mut().chain(std::iter::once(&mut total)) {
        ns.active_share = if ns.gpu_hours > 0.0 {
            ns.active_share / ns.gpu_hours
        } else {
            0.0
        };
    }
    namespaces.sort_by(|a, b| {
        b.idle_usd
            .total_cmp(&a.idle_usd)
            .then_with(|| a.namespace.cmp(&b.namespace))
    });
    let mut offenders: Vec<Offender> = b
        .workloads
        .iter()
        .filter(|w| w.idle_gpu_hours > 0.0)
        .map(|w| Offender {
            namespace: w.namespace.clone(),
            kind: w.kind.clone(),
            name: w.name.clone(),
            gpus: w.gpus,
            classification: w.classification.clone(),
            idle_gpu_hours: w.idle_gpu_hours,
            idle_usd: w.idle_usd,
        })
        .collect();
    offenders.sort_by(|a, b| {
        b.idle_usd
            .total_cmp(&a.idle_usd)
            .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    offenders.truncate(top);
    Audit {
        start: b.start,
        end: b.end,
        namespaces,
        top_offenders: offenders,
        total,
        unallocated_gpus: b.summary.unallocated_gpus,
        attribution: None,
    }
}

/// Table, JSON or CSV (one row per namespace).
pub fn render(a: &Audit, format: OutputFormat) -> Result<String> {
    const SHAPES: [&str; 4] = ["MemoryHeld", "Unused", "Provisioning", "DataStarved"];
    let shape =
        |ns: &NamespaceWaste, s: &str| ns.idle_gpu_hours_by_shape.get(s).copied().unwrap_or(0.0);
    Ok(match format {
        OutputFormat::Json => serde_json::to_string_pretty(a)? + "\n",
        OutputFormat::Csv => {
            let mut out = String::from(
                "namespace,workloads,gpus,gpu_hours,active_share,idle_gpu_hours,memory_held,unused,provisioning,data_starved,no_telemetry_gpu_hours,idle_usd\n",
            );
            for ns in a.namespaces.iter().chain(std::iter::once(&a.total)) {
                let _ = writeln!(
                    out,
                    "{},{},{},{:.3},{:.4},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.2}",
                    ns.namespace,
                    ns.workloads,
                    ns.gpus,
                    ns.gpu_hours,
                    ns.active_share,
                    ns.idle_gpu_hours,
                    shape(ns, SHAPES[0]),
                    shape(ns, SHAPES[1]),
                    shape(ns, SHAPES[2]),
                    shape(ns, SHAPES[3]),
                    ns.no_telemetry_gpu_hours,
                    ns.idle_usd
                );
            }
            out
        }
        OutputFormat::Table => {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "GPU waste from {} to {} (read-only audit)\n",
                a.start, a.end
            );
            let _ = writeln!(
                out,
                "{:<16} {:>9} {:>5} {:>9} {:>7} {:>9} {:>11} {:>7} {:>12} {:>11} {:>9}",
                "NAMESPACE",
                "WORKLOADS",
                "GPUS",
                "GPU-H",
                "ACTIVE",
                "IDLE GPU-H",
                "MEMORY-HELD",
                "UNUSED",
                "PROVISIONING",
                "DATA-STARVED",
                "IDLE USD"
            );
            for ns in a.namespaces.iter().chain(std::iter::once(&a.total)) {
                let _ = writeln!(
                    out,
                    "{:<16} {:>9} {:>5} {:>9.1} {:>6.0}% {:>10.1} {:>11.1} {:>7.1} {:>12.1} {:>12.1} {:>9.0}",
                    ns.namespace,
                    ns.workloads,
                    ns.gpus,
                    ns.gpu_hours,
                    ns.active_share * 100.0,
                    ns.idle_gpu_hours,
                    shape(ns, SHAPES[0]),
                    shape(ns, SHAPES[1]),
                    shape(ns, SHAPES[2]),
                    shape(ns, SHAPES[3]),
                    ns.idle_usd
                );
            }
            let _ = writeln!(out, "\nTop offenders by idle dollars:");
            for (i, o) in a.top_offenders.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{:>2}. {}/{} {} — {} GPU, {}, {:.1} idle GPU-hours, {:.0} USD",
                    i + 1,
                    o.namespace,
                    o.kind,
                    o.name,
                    o.gpus,
                    o.classification,
                    o.idle_gpu_hours,
                    o.idle_usd
                );
            }
            if a.unallocated_gpus > 0 {
                let _ = writeln!(
                    out,
                    "\n{} GPUs reported by DCGM had no workload (unallocated capacity).",
                    a.unallocated_gpus
                );
            }
            if let Some(at) = &a.attribution {
                let _ = writeln!(
                    out,
                    "\nWorkloads as the API server resolves them: {} GPU pods ({} unknown to kube-state-metrics); {} pods no longer exist and are attributed as recorded.",
                    at.api_server, at.not_in_kube_state_metrics, at.gone
                );
            }
            out
        }
    })
}

/// One readiness check: what was looked for, whether it holds, and the fix.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub what: String,
    pub ok: bool,
    /// Evidence, or how to fix it.
    pub detail: String,
}

/// The result of `audit --check`.
#[derive(Debug, Clone, PartialEq)]
pub struct Readiness {
    pub checks: Vec<Check>,
}

impl Readiness {
    /// All checks hold.
    pub fn ready(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// How many checks failed.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.ok).count()
    }

    /// A checklist for people.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let _ = writeln!(
                out,
                "[{}] {}: {}",
                if c.ok { "ok" } else { "!!" },
                c.what,
                c.detail
            );
        }
        let _ = writeln!(
            out,
            "\n{}",
            if self.ready() {
                "Telemetry is ready for gpu-reaper.".to_string()
            } else {
                format!("{} check(s) failed: see docs/telemetry.md.", self.failed())
            }
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::inventory::{ObjectInfo, pod_info, resolve};
    use crate::gpus::GpuResources;
    use serde_json::json;

    /// Three hours, idle with memory held: `research/nb-alice-0` (kube-state-metrics says
    /// StatefulSet nb-alice), `ml/embed-7f9c-x` (DCGM only), `ml/old-0` (DCGM only, and
    /// gone from the API server).
    fn trace() -> Trace {
        let t0 = 1_793_577_600i64;
        let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
        for (ns, pod) in [
            ("research", "nb-alice-0"),
            ("ml", "embed-7f9c-x"),
            ("ml", "old-0"),
        ] {
            for m in 0..180 {
                let _ = writeln!(
                    s,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"0\",UUID=\"GPU-{pod}\",modelName=\"NVIDIA L4\",Hostname=\"n1\",namespace=\"{ns}\",pod=\"{pod}\"}} 0 {}",
                    t0 + m * 60
                );
            }
        }
        s.push_str("# TYPE kube_pod_owner gauge\n");
        s.push_str("# TYPE kube_pod_container_resource_requests gauge\n");
        for m in 0..180 {
            let _ = writeln!(
                s,
                "kube_pod_container_resource_requests{{namespace=\"research\",pod=\"nb-alice-0\",container=\"nb\",resource=\"nvidia_com_gpu\",unit=\"integer\"}} 1 {}",
                t0 + m * 60
            );
        }
        let _ = writeln!(
            s,
            "kube_pod_owner{{namespace=\"research\",pod=\"nb-alice-0\",owner_kind=\"StatefulSet\",owner_name=\"nb-alice\",owner_is_controller=\"true\"}} 1 {t0}"
        );
        s.push_str("# EOF\n");
        crate::telemetry::trace::read_trace(
            s.as_bytes(),
            "test",
            &crate::telemetry::trace::ReadOptions::default(),
        )
        .unwrap()
    }

    /// What the API server holds: a Notebook above the StatefulSet, a Deployment above
    /// the DCGM-only pod's ReplicaSet.
    fn cluster() -> Vec<Workload> {
        let now = "2026-11-29T12:00:00Z".parse().unwrap();
        let owner = |api: &str, kind: &str, name: &str| json!([{"apiVersion": api, "kind": kind, "name": name, "uid": "u", "controller": true}]);
        let pod = |ns: &str, name: &str, owners: serde_json::Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": ns, "creationTimestamp": "2026-11-01T00:00:00Z",
                                "labels": {"app.kubernetes.io/name": "embed"}, "ownerReferences": owners},
                   "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                   "status": {"phase": "Running"}})
        };
        let pods = vec![
            pod_info(
                &pod(
                    "research",
                    "nb-alice-0",
                    owner("apps/v1", "StatefulSet", "nb-alice"),
                ),
                &GpuResources::default(),
                now,
            )
            .unwrap(),
            pod_info(
                &pod(
                    "ml",
                    "embed-7f9c-x",
                    owner("apps/v1", "ReplicaSet", "embed-7f9c"),
                ),
                &GpuResources::default(),
                now,
            )
            .unwrap(),
        ];
        let objects = [
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "nb-alice", "namespace": "research", "ownerReferences": owner("kubeflow.org/v1", "Notebook", "nb-alice")}}),
            json!({"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "metadata": {"name": "nb-alice", "namespace": "research"}}),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "embed-7f9c", "namespace": "ml", "ownerReferences": owner("apps/v1", "Deployment", "embed")}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "embed", "namespace": "ml"}}),
        ]
        .iter()
        .map(|v| {
            let o = ObjectInfo::from_value(v).unwrap();
            (o.key(), o)
        })
        .collect();
        resolve(pods, &objects)
    }

    fn offenders(a: &Audit) -> Vec<String> {
        let mut names: Vec<String> = a
            .top_offenders
            .iter()
            .map(|o| format!("{}/{}/{}", o.namespace, o.kind, o.name))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_api_server_names_the_workloads_kube_state_metrics_cannot() {
        let spec = crate::backtest::samples::sample_policy().unwrap().spec;
        let alone = audit(&spec, &trace(), 10);
        assert_eq!(
            offenders(&alone),
            [
                "ml/Pod/embed-7f9c-x",
                "ml/Pod/old-0",
                "research/StatefulSet/nb-alice"
            ]
        );
        let mut t = trace();
        let attribution = attribute(&mut t, &cluster());
        assert_eq!(
            attribution,
            Attribution {
                api_server: 2,
                not_in_kube_state_metrics: 1,
                gone: 1
            }
        );
        let resolved = audit(&spec, &t, 10);
        assert_eq!(
            offenders(&resolved),
            [
                "ml/Deployment/embed",
                "ml/Pod/old-0",
                "research/Notebook/nb-alice"
            ]
        );
        // The same GPU-hours, attributed differently.
        assert_eq!(resolved.total.gpu_hours, alone.total.gpu_hours);
        assert_eq!(resolved.total.idle_gpu_hours, alone.total.idle_gpu_hours);
        // The added pod carries the API server's labels as kube-state-metrics spells them.
        let added = t.pods.iter().find(|p| p.name == "embed-7f9c-x").unwrap();
        assert_eq!(added.labels["app_kubernetes_io_name"], "embed");
        assert_eq!(added.gpu_devices(), 1);
    }
}
