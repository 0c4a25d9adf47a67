//! The controller end to end: kube-sim for the API server, the real Prometheus (Debian
//! package) backfilled with DCGM-shaped history, kubectl to apply the policy, and the
//! `gpu-reaper controller --once --now …` binary run at chosen instants (a controllable
//! clock: no test waits for an idle hour to pass).

mod common;

use std::fmt::Write as _;
use std::process::Stdio;

use common::{Prometheus, prometheus_with};
use kube_sim::KubeSim;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
const CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml");
/// Start of the recorded history: ten minutes from now, on a whole minute. kube-sim
/// stamps objects with the wall clock when they are created, so the history is laid
/// out after that (backfilled into Prometheus ahead of time) and the controller is run
/// `--now` at instants inside it.
fn t0() -> i64 {
    static T0: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *T0.get_or_init(|| jiff::Timestamp::now().as_second() / 60 * 60 + 600)
}

fn at(minutes: i64) -> String {
    jiff::Timestamp::from_second(t0() + minutes * 60)
        .unwrap()
        .to_string()
}

/// Four hours at one-minute samples:
/// - `ml/chat-7f9c-a` (Deployment chat, 1 GPU): busy for the first hour, then idle;
/// - `ml/train-0` (Job train, 8 GPUs): GPU 0 busy throughout, GPUs 1–7 idle — busy;
/// - `ml/gappy-5d-a` (Deployment gappy, 1 GPU): busy, then the exporter goes silent.
fn history() -> Vec<u8> {
    let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    let mut series = |gpu: &str, pod: &str, value: &dyn Fn(i64) -> Option<f64>| {
        for m in 0..=240 {
            if let Some(v) = value(m) {
                let _ = writeln!(
                    s,
                    "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"{gpu}\",UUID=\"GPU-{pod}-{gpu}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\",namespace=\"ml\",pod=\"{pod}\",container=\"main\"}} {v} {}",
                    t0() + m * 60
                );
            }
        }
    };
    series("0", "chat-7f9c-a", &|m| {
        Some(if m < 60 { 0.8 } else { 0.0 })
    });
    for g in 0..8 {
        series(&g.to_string(), "train-0", &move |_| {
            Some(if g == 0 { 0.9 } else { 0.0 })
        });
    }
    series("0", "gappy-5d-a", &|m| (m < 60).then_some(0.7));
    s.push_str("# EOF\n");
    s.into_bytes()
}

fn deployment(name: &str, rs: &str, pod: &str) -> Vec<Value> {
    let created = at(-10);
    vec![
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created, "labels": {"app": name}},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
               "metadata": {"name": rs, "namespace": "ml", "creationTimestamp": created,
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": "u-d", "controller": true}]},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0"}]}}}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": pod, "namespace": "ml", "creationTimestamp": created, "labels": {"app": name},
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": "u-rs", "controller": true}]},
               "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
               "status": {"phase": "Running", "startTime": created}}),
    ]
}

fn job() -> Vec<Value> {
    let created = at(-10);
    vec![
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "train", "namespace": "ml", "creationTimestamp": created},
               "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "train-0", "namespace": "ml", "creationTimestamp": created,
                            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-j", "controller": true}]},
               "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
               "status": {"phase": "Running", "startTime": created}}),
    ]
}

fn policy(mode: &str) -> String {
    format!(
        r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {{name: inference}}
spec:
  mode: {mode}
  idle: {{window: 30m, startupGrace: 20m, minCoverage: 0.8}}
  warn: {{after: 30m}}
  action: {{type: ScaleToZero, after: 60m, maxPerHour: 20}}
"#
    )
}

struct Setup {
    sim: KubeSim,
    prometheus: Prometheus,
}

async fn setup(test: &str, mode: &str) -> Setup {
    let prometheus = prometheus_with(&format!("controller-{test}"), &history());
    let sim = KubeSim::start().await.unwrap();
    for ns in ["ml", "gpu-reaper"] {
        sim.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
    }
    for object in deployment("chat", "chat-7f9c", "chat-7f9c-a")
        .into_iter()
        .chain(deployment("gappy", "gappy-5d", "gappy-5d-a"))
        .chain(job())
    {
        sim.seed(object).unwrap();
    }
    kubectl(&sim, &["apply", "-f", CRDS], None).await;
    kubectl(&sim, &["apply", "-f", "-"], Some(&policy(mode))).await;
    Setup { sim, prometheus }
}

async fn kubectl(sim: &KubeSim, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(sim.kubeconfig_path())
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl is installed (bash .ci/run installs it)");
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt;
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).await.unwrap();
    }
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One evaluation as of `minutes` after T0; (success, stderr).
async fn cycle(s: &Setup, minutes: i64, identity: &str) -> (bool, String) {
    cycle_with_lease(s, minutes, identity, "15s").await
}

async fn cycle_with_lease(s: &Setup, minutes: i64, identity: &str, lease: &str) -> (bool, String) {
    let out = tokio::process::Command::new(BIN)
        .args(["controller", "--once", "--now", &at(minutes)])
        .args([
            "--prometheus-url",
            &s.prometheus.url,
            "--scrape-interval",
            "1m",
        ])
        .args(["--identity", identity, "--lease-duration", lease])
        .env("KUBECONFIG", s.sim.kubeconfig_path())
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn deployment_of(s: &Setup, name: &str) -> Value {
    s.sim.get("apps", "deployments", "ml", name).unwrap()
}

/// Events about `name`, as (reason, note).
fn events_for(s: &Setup, name: &str) -> Vec<(String, String)> {
    // kube-sim serves events.k8s.io/v1 and core v1 Events from one store, listed in the
    // core form (involvedObject, message).
    s.sim
        .list("", "events", Some("ml"))
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == name)
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_deployment_is_warned_then_scaled_to_zero_and_wake_brings_it_back() {
    let s = setup("scale", "Enforce").await;
    // 10 minutes idle: nothing yet.
    let (ok, log) = cycle(&s, 70, "a").await;
    assert!(ok, "{log}");
    assert!(
        deployment_of(&s, "chat")["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_none()
    );
    // 35 minutes idle: warned (annotation and Event), not acted on.
    let (ok, log) = cycle(&s, 95, "a").await;
    assert!(ok, "{log}");
    let d = deployment_of(&s, "chat");
    assert_eq!(
        d["metadata"]["annotations"]["gpureaper.io/warned-at"],
        at(95),
        "{log}"
    );
    assert_eq!(d["spec"]["replicas"], 1);
    let events = events_for(&s, "chat");
    assert!(
        events.iter().any(|(r, n)| r == "IdleGpus"
            && n.starts_with("1 GPU(s) idle since ")
            && n.contains("kubectl annotate deployment chat -n ml gpureaper.io/snooze-until=")),
        "{events:?}"
    );
    // 65 minutes idle, 30 after the warning: scaled to 0 with the restore record.
    let (ok, log) = cycle(&s, 125, "a").await;
    assert!(ok, "{log}");
    let d = deployment_of(&s, "chat");
    assert_eq!(d["spec"]["replicas"], 0, "{log}");
    let restore: Value = serde_json::from_str(
        d["metadata"]["annotations"]["gpureaper.io/restore"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(restore, json!({"replicas": 1, "state": "done"}));
    let events = events_for(&s, "chat");
    assert!(
        events.iter().any(|(r, n)| r == "Reclaimed"
            && n.contains("scaled ml/Deployment/chat from 1 replicas to 0")
            && n.contains("gpu-reaper wake ml/Deployment/chat")),
        "{events:?}"
    );

    // The 8-GPU job with one busy GPU is left alone; the gap is never idleness.
    assert!(
        events_for(&s, "train").is_empty(),
        "{:?}",
        events_for(&s, "train")
    );
    assert_eq!(deployment_of(&s, "gappy")["spec"]["replicas"], 1);
    assert!(
        deployment_of(&s, "gappy")["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_none()
    );

    // Status: governed workloads, one idle and reclaimed, Ready.
    let status = s
        .sim
        .get("gpureaper.io", "gpupolicies", "", "inference")
        .unwrap()["status"]
        .clone();
    assert_eq!(status["workloads"]["governed"], 3, "{status}");
    assert_eq!(status["workloads"]["gpus"], 10, "{status}");
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    // Spend for the budget gate: 25 USD/h of governed GPUs (10 × the default 2.5) billed
    // for at most 2 × --interval (2 min) per evaluation, twice after the first: 5/3 USD.
    assert_eq!(status["namespaceSpend"][0]["namespace"], "ml", "{status}");
    let spent = status["namespaceSpend"][0]["spentUsd"].as_f64().unwrap();
    assert!((spent - 25.0 * 4.0 / 60.0).abs() < 1e-6, "{status}");
    assert_eq!(status["lastEvaluationTime"], at(125));
    // A minute later the reclaimed GPU has been off for a minute: 1/60 GPU-hour, and the
    // price of an H100 minute at the default 2.5 USD/h saved.
    let (ok, log) = cycle(&s, 126, "a").await;
    assert!(ok, "{log}");
    let reclaimed =
        deployment_of(&s, "chat")["metadata"]["annotations"]["gpureaper.io/reclaimed"].clone();
    assert_eq!(
        serde_json::from_str::<Value>(reclaimed.as_str().unwrap()).unwrap(),
        json!({"gpus": 1.0, "hourlyUsd": 2.5})
    );
    let status = s
        .sim
        .get("gpureaper.io", "gpupolicies", "", "inference")
        .unwrap()["status"]
        .clone();
    assert!(
        (status["reclaimedGpuHours"].as_f64().unwrap() - 1.0 / 60.0).abs() < 1e-9,
        "{status}"
    );
    assert!(
        (status["estimatedSavingsUsd"].as_f64().unwrap() - 2.5 / 60.0).abs() < 1e-9,
        "{status}"
    );
    assert_eq!(status["workloads"]["reclaimed"], 1, "{status}");
    // One idle GPU over the billed evaluations (2 min at 95, 125 and 1 min at 126).
    let idle = status["idleGpuHoursLast24h"].as_f64().unwrap();
    assert!((idle - 5.0 / 60.0).abs() < 1e-3, "{status}");

    // Wake restores the replicas and restarts the ladder.
    let out = tokio::process::Command::new(BIN)
        .args(["wake", "ml/Deployment/chat"])
        .env("KUBECONFIG", s.sim.kubeconfig_path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(deployment_of(&s, "chat")["spec"]["replicas"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_mode_changes_nothing_and_reports_what_it_would_do() {
    let s = setup("audit", "Audit").await;
    let before = deployment_of(&s, "chat");
    for minute in [95, 125] {
        let (ok, log) = cycle(&s, minute, "a").await;
        assert!(ok, "{log}");
    }
    let after = deployment_of(&s, "chat");
    assert_eq!(
        after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
        "Audit wrote on the workload"
    );
    assert_eq!(after["spec"]["replicas"], 1);
    let events = events_for(&s, "chat");
    assert!(events.iter().any(|(r, _)| r == "IdleGpus"), "{events:?}");
    // Each run is a new process: the warning of the first run is remembered (in the
    // controller's own ConfigMap, not on the workload), so the second reports what it
    // would do instead of warning again.
    assert_eq!(
        events.iter().filter(|(r, _)| r == "IdleGpus").count(),
        1,
        "{events:?}"
    );
    assert!(
        events.iter().any(|(r, n)| r == "WouldReclaim" && n.starts_with("Audit mode: would ScaleToZero now")),
        "{events:?}"
    );
    let state = s
        .sim
        .get(
            "",
            "configmaps",
            "gpu-reaper",
            "gpu-reaper-controller-audit",
        )
        .unwrap();
    assert!(
        state["data"]["state.json"]
            .as_str()
            .unwrap()
            .contains("\"name\":\"chat\""),
        "{state}"
    );
}

/// `gpu-reaper audit` over the real Prometheus: the history has DCGM series only (no
/// kube-state-metrics), so alone it can name bare pods only; with `--kubeconfig` the
/// API server resolves each pod's owner chain and the waste lands on the Deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_with_a_kubeconfig_attributes_gpu_hours_to_the_workloads_the_api_server_resolves() {
    let s = setup("audit-kubeconfig", "Audit").await;
    let audit = |kubeconfig: Option<String>| {
        let url = s.prometheus.url.clone();
        async move {
            let mut command = tokio::process::Command::new(BIN);
            command.args([
                "audit",
                "--prometheus-url",
                &url,
                "--since",
                &at(0),
                "--to",
                &at(240),
            ]);
            command.args(["--format", "json"]);
            if let Some(path) = &kubeconfig {
                command.args(["--kubeconfig", path]);
            }
            let out = command.output().await.unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice::<Value>(&out.stdout).unwrap()
        }
    };
    let offenders = |v: &Value| -> Vec<String> {
        v["top_offenders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap(),
                    o["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    let alone = audit(None).await;
    assert_eq!(offenders(&alone), ["Pod/chat-7f9c-a"]);
    assert!(alone.get("attribution").is_none(), "{alone}");
    let kubeconfig = s.sim.kubeconfig_path().to_str().unwrap().to_string();
    let resolved = audit(Some(kubeconfig)).await;
    assert_eq!(offenders(&resolved), ["Deployment/chat"]);
    assert_eq!(
        resolved["attribution"],
        json!({"api_server": 3, "not_in_kube_state_metrics": 3, "gone": 0})
    );
    assert_eq!(resolved["total"]["gpu_hours"], alone["total"]["gpu_hours"]);
    // Read-only: nothing was written to the cluster.
    assert_eq!(deployment_of(&s, "chat")["metadata"]["generation"], 1);
    // A kubeconfig that cannot be read is named, with nothing reported.
    let out = tokio::process::Command::new(BIN)
        .args([
            "audit",
            "--prometheus-url",
            &s.prometheus.url,
            "--since",
            &at(0),
            "--to",
            &at(240),
        ])
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .await
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(
        e.contains("--kubeconfig") && e.contains("/nonexistent/kubeconfig"),
        "{e}"
    );
    assert!(out.stdout.is_empty());
}

/// A request-driven inference server: `ml/serve` (Deployment, 3 replicas of 1 GPU) busy
/// 10 minutes and idle 3, for 26 hours, then idle. Each `controller --once` is a fresh
/// process: what it knows of the server's rhythm it learns by backfilling the last 24
/// hours from Prometheus, so the policy's `action.inference` scales it down to one
/// replica — warned first, saying so — instead of to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_controller_backfills_the_rhythm_and_scales_request_driven_inference_to_its_minimum()
 {
    let mut history = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for r in 0..3 {
        for m in 0..=(29 * 60) {
            let v = if m < 26 * 60 && m % 13 < 10 { 0.7 } else { 0.0 };
            let _ = writeln!(
                history,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"{r}\",UUID=\"GPU-serve-{r}\",modelName=\"NVIDIA L4\",Hostname=\"n1\",namespace=\"ml\",pod=\"serve-6d-{r}\",container=\"main\"}} {v} {}",
                t0() + m * 60
            );
        }
    }
    history.push_str("# EOF\n");
    let prometheus = prometheus_with("controller-backfill", history.as_bytes());
    let sim = KubeSim::start().await.unwrap();
    for ns in ["ml", "gpu-reaper"] {
        sim.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
    }
    let created = at(-10);
    let limits = json!({"limits": {"nvidia.com/gpu": "1"}});
    sim.seed(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": "ml", "creationTimestamp": created, "labels": {"app": "serve"}},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "serve"}},
                 "template": {"metadata": {"labels": {"app": "serve"}}, "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0", "resources": limits}]}}}}))
        .unwrap();
    sim.seed(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "serve-6d", "namespace": "ml", "creationTimestamp": created,
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "serve", "uid": "u-d", "controller": true}]},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "serve"}},
                 "template": {"metadata": {"labels": {"app": "serve"}}, "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0"}]}}}}))
        .unwrap();
    for r in 0..3 {
        sim.seed(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("serve-6d-{r}"), "namespace": "ml", "creationTimestamp": created, "labels": {"app": "serve"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "serve-6d", "uid": "u-rs", "controller": true}]},
            "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.0", "resources": limits}]},
            "status": {"phase": "Running", "startTime": created}}))
            .unwrap();
    }
    kubectl(&sim, &["apply", "-f", CRDS], None).await;
    let policy = r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: inference}
spec:
  mode: Enforce
  idle: {window: 30m, startupGrace: 20m, minCoverage: 0.8}
  warn: {after: 30m}
  action: {type: ScaleToZero, after: 60m, maxPerHour: 20, inference: {minReplicas: 1}}
"#;
    kubectl(&sim, &["apply", "-f", "-"], Some(policy)).await;
    let s = Setup { sim, prometheus };
    // Idle since 26:00; warned at 26:45.
    let (ok, log) = cycle(&s, 26 * 60 + 45, "a").await;
    assert!(ok, "{log}");
    assert!(
        log.contains("idle-span history backfilled from Prometheus"),
        "{log}"
    );
    let events = events_for(&s, "serve");
    let warning = events
        .iter()
        .find(|(r, _)| r == "IdleGpus")
        .unwrap_or_else(|| panic!("{events:?}\n{log}"));
    assert!(
        warning.1.contains("will scale it down to 1 replica(s) instead of zero (request-driven inference: its idle spans are short and frequent (a typical idle span under 4m)"),
        "{warning:?}"
    );
    assert_eq!(deployment_of(&s, "serve")["spec"]["replicas"], 3);
    // An hour later: scaled to one replica, not zero; the record keeps all three.
    let (ok, log) = cycle(&s, 27 * 60 + 50, "a").await;
    assert!(ok, "{log}");
    let after = deployment_of(&s, "serve");
    assert_eq!(after["spec"]["replicas"], 1, "{log}");
    let record: Value = serde_json::from_str(
        after["metadata"]["annotations"]["gpureaper.io/restore"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record, json!({"replicas": 3, "kept": 1, "state": "done"}));
    assert!(
        events_for(&s, "serve").iter().any(|(r, n)| r == "Reclaimed"
            && n.contains("scaled ml/Deployment/serve from 3 replicas to 1")),
        "{:?}",
        events_for(&s, "serve")
    );
    // `--history-backfill 0s` turns the replay off (the cycles then learn on their own).
    let out = tokio::process::Command::new(BIN)
        .args([
            "controller",
            "--once",
            "--now",
            &at(26 * 60 + 45),
            "--history-backfill",
            "0s",
        ])
        .args([
            "--prometheus-url",
            &s.prometheus.url,
            "--scrape-interval",
            "1m",
        ])
        .args(["--identity", "a", "--lease-duration", "15s"])
        .env("KUBECONFIG", s.sim.kubeconfig_path())
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(!log.contains("backfilled"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_acts() {
    let s = setup("lease", "Enforce").await;
    let (ok, log) = cycle(&s, 95, "replica-a").await;
    assert!(ok, "{log}");
    // A second replica within the lease duration is a standby: it does not evaluate.
    let (ok, log) = cycle(&s, 125, "replica-b").await;
    assert!(!ok);
    assert!(
        log.contains(
            "not the leader: Lease gpu-reaper/gpu-reaper-controller is held by another replica"
        ),
        "{log}"
    );
    assert_eq!(
        deployment_of(&s, "chat")["spec"]["replicas"],
        1,
        "the standby acted"
    );
    let lease = s
        .sim
        .get(
            "coordination.k8s.io",
            "leases",
            "gpu-reaper",
            "gpu-reaper-controller",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_down_marks_the_policy_degraded_and_acts_on_nothing() {
    let mut s = setup("down", "Enforce").await;
    s.prometheus.url = "http://127.0.0.1:9".into();
    let (ok, log) = cycle(&s, 125, "a").await;
    assert!(ok, "{log}");
    assert_eq!(deployment_of(&s, "chat")["spec"]["replicas"], 1);
    let status = s
        .sim
        .get("gpureaper.io", "gpupolicies", "", "inference")
        .unwrap()["status"]
        .clone();
    let degraded = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap();
    assert_eq!(degraded["status"], "True", "{status}");
    assert_eq!(degraded["reason"], "TelemetryUnavailable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_once_the_leader_stops_renewing() {
    let s = setup("handover", "Enforce").await;
    let (ok, log) = cycle_with_lease(&s, 95, "replica-a", "1s").await;
    assert!(ok, "{log}");
    // replica-a is gone; its 1 s Lease runs out.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let (ok, log) = cycle_with_lease(&s, 125, "replica-b", "1s").await;
    assert!(ok, "{log}");
    let lease = s
        .sim
        .get(
            "coordination.k8s.io",
            "leases",
            "gpu-reaper",
            "gpu-reaper-controller",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    // The new leader carries on from the annotations: the warning replica-a wrote counts.
    assert_eq!(deployment_of(&s, "chat")["spec"]["replicas"], 0, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_after_the_restore_record_finishes_the_scale_on_its_next_cycle() {
    let s = setup("resume", "Enforce").await;
    // What a run killed between its two writes leaves behind.
    kubectl(
        &s.sim,
        &[
            "annotate",
            "deployment",
            "chat",
            "-n",
            "ml",
            r#"gpureaper.io/restore={"replicas":1,"state":"pending"}"#,
            "gpureaper.io/reaped-action=ScaleToZero",
            &format!("gpureaper.io/reaped-at={}", at(124)),
        ],
        None,
    )
    .await;
    let (ok, log) = cycle(&s, 126, "a").await;
    assert!(ok, "{log}");
    let d = deployment_of(&s, "chat");
    assert_eq!(d["spec"]["replicas"], 0, "{log}");
    let restore: Value = serde_json::from_str(
        d["metadata"]["annotations"]["gpureaper.io/restore"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        restore,
        json!({"replicas": 1, "state": "done"}),
        "the restore record survived"
    );
    assert_eq!(
        d["metadata"]["annotations"]["gpureaper.io/reaped-at"],
        at(124),
        "one action, not two"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wake_annotation_restores_and_an_owner_scaling_back_by_hand_restarts_the_ladder() {
    let s = setup("wake", "Enforce").await;
    for minute in [95, 125] {
        let (ok, log) = cycle(&s, minute, "a").await;
        assert!(ok, "{log}");
    }
    assert_eq!(deployment_of(&s, "chat")["spec"]["replicas"], 0);
    kubectl(
        &s.sim,
        &[
            "annotate",
            "deployment",
            "chat",
            "-n",
            "ml",
            "gpureaper.io/wake=true",
        ],
        None,
    )
    .await;
    let (ok, log) = cycle(&s, 126, "a").await;
    assert!(ok, "{log}");
    let d = deployment_of(&s, "chat");
    assert_eq!(d["spec"]["replicas"], 1, "{log}");
    let annotations = d["metadata"]["annotations"].as_object().unwrap();
    assert!(
        !annotations.contains_key("gpureaper.io/wake"),
        "{annotations:?}"
    );
    assert!(
        !annotations.contains_key("gpureaper.io/restore"),
        "{annotations:?}"
    );
    assert!(
        annotations.contains_key("gpureaper.io/woken-at"),
        "{annotations:?}"
    );
    assert!(
        events_for(&s, "chat")
            .iter()
            .any(|(r, n)| r == "Woken" && n == "scaled ml/Deployment/chat back to 1 replicas")
    );
    assert!(
        !events_for(&s, "chat")
            .iter()
            .any(|(r, _)| r == "RestoredByOwner"),
        "a wake is not an owner's scale-up"
    );

    // gappy was reclaimed earlier (record done) and its owner scaled it back by hand.
    kubectl(
        &s.sim,
        &[
            "annotate",
            "deployment",
            "gappy",
            "-n",
            "ml",
            r#"gpureaper.io/restore={"replicas":1,"state":"done"}"#,
            "gpureaper.io/reaped-action=ScaleToZero",
            &format!("gpureaper.io/reaped-at={}", at(20)),
        ],
        None,
    )
    .await;
    let (ok, log) = cycle(&s, 127, "a").await;
    assert!(ok, "{log}");
    let g = deployment_of(&s, "gappy");
    let annotations = g["metadata"]["annotations"].as_object().unwrap();
    assert!(
        !annotations.contains_key("gpureaper.io/reaped-at"),
        "{annotations:?}"
    );
    assert!(
        events_for(&s, "gappy")
            .iter()
            .any(|(r, _)| r == "RestoredByOwner"),
        "{:?}",
        events_for(&s, "gappy")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_controller_watches_the_cluster_and_reacts_to_a_policy_change_at_once() {
    let s = setup("running", "Audit").await;
    let port = common::free_port();
    // A one-hour interval: anything after the first cycle is driven by the policy watch.
    let mut child = tokio::process::Command::new(BIN)
        .args(["controller", "--interval", "1h", "--now", &at(125)])
        .args([
            "--prometheus-url",
            &s.prometheus.url,
            "--scrape-interval",
            "1m",
        ])
        .args([
            "--identity",
            "only",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("KUBECONFIG", s.sim.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !common::http_ok(port, "/readyz") {
        assert!(
            std::time::Instant::now() < deadline,
            "controller never ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Audit: the first cycle warned by Event only.
    assert!(
        deployment_of(&s, "chat")["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_none()
    );
    kubectl(
        &s.sim,
        &[
            "patch",
            "gpupolicy",
            "inference",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"mode":"Enforce"}}"#,
        ],
        None,
    )
    .await;
    // Enforce now: the watch-triggered cycle records the warning on the workload.
    loop {
        let d = deployment_of(&s, "chat");
        if d["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_some()
        {
            assert_eq!(
                d["metadata"]["annotations"]["gpureaper.io/warned-at"],
                at(125)
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the policy change did not trigger a cycle"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watches_resolve_pods_through_a_scalable_crd_found_by_discovery_and_count_named_resource_claims()
 {
    use gpu_reaper::admission::count::GpuResources;
    use gpu_reaper::api::policy::ActionType;
    use gpu_reaper::cluster::actions::{self, Outcome};
    use gpu_reaper::cluster::inventory::{ObjectKey, resolve};
    use gpu_reaper::controller::caches::Caches;

    let sim = KubeSim::start().await.unwrap();
    let client = sim.client().await.unwrap();
    let crd = |group: &str, kind: &str, plural: &str, scale: bool| {
        let mut version = json!({"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
        if scale {
            version["subresources"] = json!({"scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}});
        }
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {"group": group, "scope": "Namespaced", "versions": [version],
                     "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")}}})
    };
    let owned_pod = |name: &str, owner: (&str, &str, &str), resources: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "ownerReferences": [
                {"apiVersion": owner.0, "kind": owner.1, "name": owner.2, "uid": "u", "controller": true}]},
            "spec": resources, "status": {"phase": "Running"}})
    };
    let one_gpu =
        json!({"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
    let shared_claim = json!({"containers": [{"name": "c", "resources": {"claims": [{"name": "gpus"}]}}],
        "resourceClaims": [{"name": "gpus", "resourceClaimName": "shared"}]});
    for object in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}),
        // A CRD gpu-reaper has never heard of, with /scale and an unconventional plural.
        crd("inference.example.com", "Matrix", "matrices", true),
        json!({"apiVersion": "inference.example.com/v1", "kind": "Matrix",
               "metadata": {"name": "mm", "namespace": "ml"}, "spec": {"replicas": 2}}),
        owned_pod(
            "mm-0",
            ("inference.example.com/v1", "Matrix", "mm"),
            one_gpu.clone(),
        ),
        // One without /scale: not watched, its pod reported under it.
        crd("trainer.example.com", "Trainer", "trainers", false),
        owned_pod("t-0", ("trainer.example.com/v1", "Trainer", "t"), one_gpu),
        // Two pods of one ReplicaSet sharing an existing ResourceClaim of 2 GPUs.
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "shared", "namespace": "ml"},
               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "serve-1", "namespace": "ml"},
               "spec": {"selector": {"matchLabels": {"app": "serve"}}, "template": {"metadata": {"labels": {"app": "serve"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
        owned_pod(
            "serve-1-a",
            ("apps/v1", "ReplicaSet", "serve-1"),
            shared_claim.clone(),
        ),
        owned_pod(
            "serve-1-b",
            ("apps/v1", "ReplicaSet", "serve-1"),
            shared_claim,
        ),
    ] {
        sim.seed(object).unwrap();
    }
    kubectl(&sim, &["apply", "-f", CRDS], None).await;
    let caches = Caches::start(&client, &[("apps", "v1", "ReplicaSet", "replicasets")]).await;
    tokio::time::timeout(std::time::Duration::from_secs(30), caches.wait_synced())
        .await
        .expect("watches synced");
    let (pods, owners, _, _) = caches.read(&GpuResources::default(), jiff::Timestamp::now());
    let workloads = resolve(pods, &owners);
    let find = |name: &str| {
        workloads
            .iter()
            .find(|w| w.pods.iter().any(|p| p.meta.name == name))
            .unwrap_or_else(|| panic!("{name} not inventoried: {workloads:#?}"))
    };
    let matrix = find("mm-0");
    assert_eq!(
        matrix.root.key(),
        ObjectKey::new("inference.example.com/v1", "Matrix", "ml", "mm")
    );
    assert_eq!(matrix.unwatched_owner, None);
    let trainer = find("t-0");
    assert_eq!(trainer.root.kind, "Pod");
    assert_eq!(
        trainer.unwatched_owner.as_ref().map(|o| o.kind.as_str()),
        Some("Trainer")
    );
    let serve = find("serve-1-a");
    assert_eq!(serve.root.kind, "ReplicaSet");
    assert_eq!(serve.pods.len(), 2);
    assert_eq!(serve.gpus, 2.0, "one shared claim of 2 GPUs, counted once");
    assert!(serve.pods.iter().all(|p| p.state.gpu_devices == 2));

    // What a cycle would do with the discovered root: scale it through /scale.
    let outcome = actions::act(
        &client,
        ActionType::ScaleToZero,
        &matrix.root,
        &matrix.pods,
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Done("scaled ml/Matrix/mm from 2 replicas to 0".into())
    );
    assert_eq!(
        s_get(&sim, "inference.example.com", "matrices", "mm")["spec"]["replicas"],
        0
    );
}

fn s_get(sim: &KubeSim, group: &str, plural: &str, name: &str) -> Value {
    sim.get(group, plural, "ml", name).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_renews_its_lease_between_evaluations() {
    let s = setup("renew", "Audit").await;
    let port = common::free_port();
    // Evaluations an hour apart, a Lease of 2 s: only renewing on its own clock keeps it.
    let _leader = tokio::process::Command::new(BIN)
        .args(["controller", "--interval", "1h", "--lease-duration", "2s"])
        .args([
            "--prometheus-url",
            &s.prometheus.url,
            "--scrape-interval",
            "1m",
        ])
        .args(["--identity", "a", "--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", s.sim.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !common::http_ok(port, "/readyz") {
        assert!(
            std::time::Instant::now() < deadline,
            "controller never ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Three Lease durations later the standby still cannot take over.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let (ok, log) = cycle_with_lease(&s, 125, "b", "2s").await;
    assert!(
        !ok,
        "the standby took a Lease its leader keeps renewing: {log}"
    );
    assert!(log.contains("not the leader"), "{log}");
    let lease = s
        .sim
        .get(
            "coordination.k8s.io",
            "leases",
            "gpu-reaper",
            "gpu-reaper-controller",
        )
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
}
