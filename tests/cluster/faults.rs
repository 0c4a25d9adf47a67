//! Fault injection (issue 10): the controller and the budget gate under a misbehaving API
//! server (kube-sim's fault modes), a killed controller, a lost Lease, a mass-idle event,
//! a Prometheus that lies or stops, and secrets kept out of logs and objects. Each test
//! asserts what must hold, not merely that nothing crashed. The faults already covered
//! elsewhere are listed in docs/reliability.md with the test that covers them.
//!
//! Same harness as tests/cluster/controller.rs: kube-sim in-process, the real Prometheus
//! backfilled with DCGM-shaped history, and the real binary run `--once --now T`.

use crate::common;

use std::fmt::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Prometheus, prometheus_with};
use kube_sim::{Fault, KubeSim};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_gpu-reaper");
const CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml");
const CHAT: &str = "/apis/apps/v1/namespaces/ml/deployments/chat";

/// Start of the recorded history, ten minutes ahead on a whole minute (see
/// tests/cluster/controller.rs: kube-sim stamps objects with the wall clock).
fn t0() -> i64 {
    static T0: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *T0.get_or_init(|| jiff::Timestamp::now().as_second() / 60 * 60 + 600)
}

fn at(minutes: i64) -> String {
    common::at(t0(), minutes)
}

/// What a GPU reports over the history: busy (0.8) for the first hour, then `after`.
#[derive(Clone, Copy)]
enum After {
    Idle,
    /// The exporter sends NaN (a broken DCGM field).
    NaN,
    /// The exporter sends a negative ratio (a lying exporter).
    Negative,
}

/// One GPU per pod (`<deployment>-rs-a`), one sample a minute for `minutes` minutes.
fn history(pods: &[(String, After)], minutes: i64) -> Vec<u8> {
    let mut s = String::from("# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n");
    for (deployment, after) in pods {
        let pod = format!("{deployment}-rs-a");
        for m in 0..=minutes {
            let value = match (m < 60, after) {
                (true, _) => "0.8",
                (false, After::Idle) => "0",
                (false, After::NaN) => "NaN",
                (false, After::Negative) => "-0.5",
            };
            let _ = writeln!(
                s,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu=\"0\",UUID=\"GPU-{pod}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\",namespace=\"ml\",pod=\"{pod}\",container=\"main\"}} {value} {}",
                t0() + m * 60
            );
        }
    }
    s.push_str("# EOF\n");
    s.into_bytes()
}

/// A one-GPU Deployment `name` with its ReplicaSet and Running pod.
fn deployment(name: &str) -> Vec<Value> {
    let created = at(-10);
    let rs = format!("{name}-rs");
    let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
    vec![
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created, "labels": {"app": name}},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": "x", "resources": gpu}]}}}}),
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
               "metadata": {"name": rs, "namespace": "ml", "creationTimestamp": created,
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": format!("u-{name}"), "controller": true}]},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "main", "image": "x"}]}}}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": format!("{rs}-a"), "namespace": "ml", "creationTimestamp": created, "labels": {"app": name},
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": format!("u-{rs}"), "controller": true}]},
               "spec": {"containers": [{"name": "main", "image": "x", "resources": gpu}]},
               "status": {"phase": "Running", "startTime": created}}),
    ]
}

fn policy(mode: &str, warn_extra: &str) -> String {
    format!(
        r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {{name: inference}}
spec:
  mode: {mode}
  idle: {{window: 30m, startupGrace: 20m, minCoverage: 0.8}}
  warn: {{after: 30m{warn_extra}}}
  action: {{type: ScaleToZero, after: 60m, maxPerHour: 20}}
"#
    )
}

/// kube-sim with namespaces, the CRDs, `policy` and one Deployment per name.
async fn cluster(names: &[&str], policy: &str) -> KubeSim {
    let sim = KubeSim::start().await.unwrap();
    for ns in ["ml", "gpu-reaper"] {
        sim.seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .unwrap();
    }
    for name in names {
        for object in deployment(name) {
            sim.seed(object).unwrap();
        }
    }
    kubectl(&sim, &["apply", "-f", CRDS], None).await;
    kubectl(&sim, &["apply", "-f", "-"], Some(policy)).await;
    sim
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

/// The controller's command line for one evaluation as of `minutes` after T0.
fn controller(
    sim: &KubeSim,
    prometheus: &str,
    minutes: i64,
    identity: &str,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(["controller", "--once", "--now", &at(minutes)])
        .args(["--prometheus-url", prometheus, "--scrape-interval", "1m"])
        .args(["--identity", identity])
        .env("KUBECONFIG", sim.kubeconfig_path())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    command
}

/// One evaluation; (success, stderr).
async fn once(sim: &KubeSim, prometheus: &str, minutes: i64) -> (bool, String) {
    let out = controller(sim, prometheus, minutes, "a")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One evaluation that must succeed; its stderr.
async fn once_ok(sim: &KubeSim, prometheus: &str, minutes: i64) -> String {
    let (ok, log) = once(sim, prometheus, minutes).await;
    assert!(ok, "controller at +{minutes}m failed: {log}");
    log
}

fn stored(sim: &KubeSim, name: &str) -> Value {
    sim.get("apps", "deployments", "ml", name).unwrap()
}

fn annotation(sim: &KubeSim, name: &str, key: &str) -> Option<String> {
    stored(sim, name)["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

fn replicas(sim: &KubeSim, name: &str) -> i64 {
    stored(sim, name)["spec"]["replicas"].as_i64().unwrap()
}

fn restore_record(sim: &KubeSim, name: &str) -> Option<Value> {
    annotation(sim, name, "gpureaper.io/restore").map(|t| serde_json::from_str(&t).unwrap())
}

/// Events about `name`, as (reason, message).
fn events_for(sim: &KubeSim, name: &str) -> Vec<(String, String)> {
    sim.list("", "events", Some("ml"))
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

/// Events of `reason` about `name`, counting an Event's repeats (`count`).
fn count_events(sim: &KubeSim, name: &str, reason: &str) -> i64 {
    sim.list("", "events", Some("ml"))
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
        .map(|e| e["count"].as_i64().unwrap_or(1).max(1))
        .sum()
}

async fn wake(sim: &KubeSim, name: &str) {
    common::wake(sim.kubeconfig_path(), &format!("ml/Deployment/{name}")).await;
}

fn condition(sim: &KubeSim, type_: &str) -> Value {
    let status = sim
        .get("gpureaper.io", "gpupolicies", "", "inference")
        .unwrap()["status"]
        .clone();
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or_else(|| panic!("no {type_} condition: {status}"))
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn idle(names: &[&str]) -> Vec<(String, After)> {
    names.iter().map(|n| (n.to_string(), After::Idle)).collect()
}

/// A 409 Conflict on the action's first write leaves nothing half-done and the next cycle
/// acts; a 409 on the write that marks the record done is finished by the next cycle's
/// housekeeping. Either way the workload is reclaimed exactly once with its record intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicts_on_the_action_writes_are_recovered_and_the_workload_is_reclaimed_once() {
    let prometheus = prometheus_with("faults-conflict", &history(&idle(&["chat"]), 140));
    let url = prometheus.url.clone();
    let sim = cluster(&["chat"], &policy("Enforce", "")).await;
    once_ok(&sim, &url, 95).await;
    assert_eq!(
        annotation(&sim, "chat", "gpureaper.io/warned-at"),
        Some(at(95))
    );

    // The restore record's write (the action's first write) answers 409.
    sim.add_fault(Fault::on(CHAT).method("PATCH").status(409).times(1));
    let log = once_ok(&sim, &url, 125).await;
    assert_eq!(sim.fault_hits(), vec![1]);
    assert_eq!(replicas(&sim, "chat"), 1, "{log}");
    assert_eq!(restore_record(&sim, "chat"), None, "nothing half-done");
    assert_eq!(annotation(&sim, "chat", "gpureaper.io/reaped-at"), None);
    assert_eq!(count_events(&sim, "chat", "ReclaimFailed"), 1, "{log}");

    // Next cycle: record, scale, then the write marking it done answers 409.
    sim.clear_faults();
    sim.add_fault(
        Fault::on(CHAT)
            .method("PATCH")
            .every_nth(3)
            .times(1)
            .status(409),
    );
    let log = once_ok(&sim, &url, 126).await;
    assert_eq!(sim.fault_hits(), vec![1]);
    assert_eq!(replicas(&sim, "chat"), 0, "{log}");
    assert_eq!(
        restore_record(&sim, "chat"),
        Some(json!({"replicas": 1, "state": "pending"}))
    );

    // The cycle after finishes it: same record, same action time, no second action.
    sim.clear_faults();
    let log = once_ok(&sim, &url, 127).await;
    assert_eq!(replicas(&sim, "chat"), 0, "{log}");
    assert_eq!(
        restore_record(&sim, "chat"),
        Some(json!({"replicas": 1, "state": "done"}))
    );
    assert_eq!(
        annotation(&sim, "chat", "gpureaper.io/reaped-at"),
        Some(at(126))
    );
    wake(&sim, "chat").await;
    assert_eq!(replicas(&sim, "chat"), 1);
}

/// 429, 500 and 504 from the API server: the controller makes one request where it
/// fails (no retry storm inside a cycle: the client's retry layer is off), acts on nothing
/// it could not observe, and a later cycle completes the action once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_429_500_and_504_fail_one_request_each_and_a_later_cycle_acts_once() {
    let prometheus = prometheus_with("faults-5xx", &history(&idle(&["chat"]), 140));
    let url = prometheus.url.clone();
    let sim = cluster(&["chat"], &policy("Enforce", "")).await;
    once_ok(&sim, &url, 95).await;
    let before = stored(&sim, "chat")["metadata"]["resourceVersion"].clone();
    // Counts every scale write over the whole test (a rule without a status).
    sim.add_fault(Fault::on(format!("{CHAT}/scale")).method("PATCH"));

    // Listing pods is throttled: the cycle stops before deciding anything.
    sim.add_fault(
        Fault::on("/api/v1/pods")
            .non_watch_only()
            .status(429)
            .times(1),
    );
    let (ok, log) = once(&sim, &url, 125).await;
    assert!(!ok, "a cycle that could not list pods must fail: {log}");
    assert!(log.contains("listing pods"), "{log}");
    assert_eq!(
        sim.fault_hits(),
        vec![0, 1],
        "one request, not a retry storm"
    );
    assert_eq!(
        stored(&sim, "chat")["metadata"]["resourceVersion"],
        before,
        "the workload was written after a failed observation"
    );

    // The scale answers 500, then 504 on the next cycle: the record stays pending.
    sim.clear_faults();
    sim.add_fault(Fault::on(format!("{CHAT}/scale")).method("PATCH"));
    sim.add_fault(
        Fault::on(format!("{CHAT}/scale"))
            .method("PATCH")
            .status(500)
            .times(1),
    );
    let log = once_ok(&sim, &url, 125).await;
    assert_eq!(replicas(&sim, "chat"), 1, "{log}");
    assert_eq!(
        restore_record(&sim, "chat"),
        Some(json!({"replicas": 1, "state": "pending"}))
    );
    assert_eq!(count_events(&sim, "chat", "ReclaimFailed"), 1, "{log}");
    sim.add_fault(
        Fault::on(format!("{CHAT}/scale"))
            .method("PATCH")
            .status(504)
            .times(1),
    );
    let log = once_ok(&sim, &url, 126).await;
    assert_eq!(replicas(&sim, "chat"), 1, "{log}");
    let log = once_ok(&sim, &url, 127).await;
    assert_eq!(replicas(&sim, "chat"), 0, "{log}");
    assert_eq!(
        restore_record(&sim, "chat"),
        Some(json!({"replicas": 1, "state": "done"}))
    );
    assert_eq!(
        annotation(&sim, "chat", "gpureaper.io/reaped-at"),
        Some(at(125)),
        "one action, finished later, not a second one"
    );
    // Three cycles, three scale requests: one per cycle, whatever the answer.
    assert_eq!(sim.fault_hits(), vec![3, 1, 1]);
}

/// A running controller whose watches fail retries them with backoff (a handful of
/// requests, not a tight loop), is not ready meanwhile, syncs once the API server
/// recovers, and recovers from a 410 Gone on a watch: a policy change made after it is
/// still seen and acted on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_watches_are_retried_with_backoff_and_a_410_gone_is_recovered() {
    let prometheus = prometheus_with("faults-watch", &history(&idle(&["chat"]), 140));
    let sim = cluster(&["chat"], &policy("Audit", "")).await;
    sim.add_fault(Fault::on("/api/v1/pods").status(500));
    let port = common::free_port();
    let mut child = tokio::process::Command::new(BIN)
        .args(["controller", "--interval", "1h", "--now", &at(125)])
        .args([
            "--prometheus-url",
            &prometheus.url,
            "--scrape-interval",
            "1m",
        ])
        .args([
            "--identity",
            "only",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("KUBECONFIG", sim.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until("the probe server", Duration::from_secs(30), || {
        common::http_ok(port, "/healthz")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let failed = sim.fault_hits()[0];
    eprintln!("pod list/watch requests while failing for 4 s: {failed}");
    assert!(
        (1..=10).contains(&failed),
        "{failed} pod requests in 4 s: the watch is not backing off"
    );
    assert!(
        !common::http_ok(port, "/readyz"),
        "ready on unsynced caches"
    );
    sim.clear_faults();
    wait_until("readiness after recovery", Duration::from_secs(60), || {
        common::http_ok(port, "/readyz")
    })
    .await;

    // Every watch is cut and the policy watch's resume answers 410 Gone.
    sim.add_fault(
        Fault::on("/apis/gpureaper.io/v1alpha1/gpupolicies")
            .watch_only()
            .status(410)
            .times(1),
    );
    sim.drop_watches();
    wait_until("the 410 to be served", Duration::from_secs(30), || {
        sim.fault_hits()[0] == 1
    })
    .await;
    kubectl(
        &sim,
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
    wait_until(
        "the policy change to reach the controller after the 410",
        Duration::from_secs(60),
        || annotation(&sim, "chat", "gpureaper.io/warned-at").is_some(),
    )
    .await;
    assert_eq!(
        annotation(&sim, "chat", "gpureaper.io/warned-at"),
        Some(at(125))
    );
    child.kill().await.unwrap();
}

/// The controller killed at each step of a ScaleToZero (the request of that step held
/// in flight by kube-sim, then the process killed): the next run finishes the same action
/// without a second one, the restore record keeps the original replica count, and
/// `gpu-reaper wake` restores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_at_each_step_of_an_action_resumes_without_acting_twice() {
    let prometheus = prometheus_with("faults-kill", &history(&idle(&["chat"]), 140));
    let url = prometheus.url.clone();
    let hold = Duration::from_secs(3);
    let steps: Vec<(&str, Fault)> = vec![
        (
            "after the restore record, before the scale",
            Fault::on(format!("{CHAT}/scale")).method("PATCH"),
        ),
        (
            "after the scale, before the record is marked done",
            Fault::on(CHAT).method("PATCH").every_nth(3).times(1),
        ),
        (
            "after the record is done, before the Event",
            Fault::on("/apis/events.k8s.io/v1/namespaces/ml/events")
                .method("POST")
                .times(1),
        ),
    ];
    for (step, fault) in steps {
        let sim = cluster(&["chat"], &policy("Enforce", "")).await;
        once_ok(&sim, &url, 95).await;
        sim.add_fault(fault.latency(hold));
        let log_path = std::env::temp_dir().join(format!("faults-kill-{}.log", std::process::id()));
        let mut child = controller(&sim, &url, 125, "a")
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        wait_until(
            &format!("the run to reach {step}"),
            Duration::from_secs(60),
            || sim.fault_hits() == vec![1],
        )
        .await;
        child.kill().await.unwrap();
        let killed_log = std::fs::read_to_string(&log_path).unwrap_or_default();
        // Whatever the held request does once released, it is over before the next run.
        tokio::time::sleep(hold + Duration::from_millis(500)).await;
        sim.clear_faults();

        let log = once_ok(&sim, &url, 126).await;
        let context = format!("killed {step}\nkilled run:\n{killed_log}\nnext run:\n{log}");
        assert_eq!(replicas(&sim, "chat"), 0, "{context}");
        assert_eq!(
            restore_record(&sim, "chat"),
            Some(json!({"replicas": 1, "state": "done"})),
            "{context}"
        );
        assert_eq!(
            annotation(&sim, "chat", "gpureaper.io/reaped-at"),
            Some(at(125)),
            "a second action: {context}"
        );
        assert_eq!(count_events(&sim, "chat", "ReclaimFailed"), 0, "{context}");
        // A third run changes nothing more.
        once_ok(&sim, &url, 127).await;
        let after = stored(&sim, "chat");
        assert_eq!(after["spec"]["replicas"], 0, "{context}");
        assert_eq!(
            after["metadata"]["annotations"]["gpureaper.io/reaped-at"],
            at(125)
        );
        wake(&sim, "chat").await;
        assert_eq!(replicas(&sim, "chat"), 1, "{context}");
        let _ = std::fs::remove_file(&log_path);
    }
}

/// The Lease is taken by another replica while the leader is in the middle of a cycle
/// (its first action's write held by kube-sim): the old leader finishes the write it
/// started and starts no other action; the new leader acts on the rest. Every workload
/// is reclaimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_mid_cycle_hands_over_without_double_actions() {
    use k8s_openapi::api::coordination::v1::Lease;
    let names = ["chat", "chat2", "chat3"];
    let prometheus = prometheus_with("faults-leader", &history(&idle(&names), 140));
    let url = prometheus.url.clone();
    let sim = cluster(&names, &policy("Enforce", "")).await;
    let out = controller(&sim, &url, 95, "a")
        .args(["--lease-duration", "3s"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    // The first write to any Deployment during the next cycle is held for 4 s.
    sim.add_fault(
        Fault::on("/apis/apps/v1/namespaces/ml/deployments/")
            .method("PATCH")
            .times(1)
            .latency(Duration::from_secs(4)),
    );
    let port = common::free_port();
    let log_path = std::env::temp_dir().join(format!("faults-leader-{}.log", std::process::id()));
    let mut leader = tokio::process::Command::new(BIN)
        .args(["controller", "--interval", "1h", "--now", &at(125)])
        .args(["--prometheus-url", &url, "--scrape-interval", "1m"])
        .args(["--identity", "a", "--lease-duration", "3s"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", sim.kubeconfig_path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until("the leader's first action", Duration::from_secs(60), || {
        sim.fault_hits() == vec![1]
    })
    .await;
    // Replica b takes the Lease (as after a partition: a's renewals did not land).
    let leases: kube::Api<Lease> = kube::Api::namespaced(sim.client().await.unwrap(), "gpu-reaper");
    let mut lease = leases.get("gpu-reaper-controller").await.unwrap();
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some("b".into());
    spec.lease_duration_seconds = Some(60);
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        jiff::Timestamp::now(),
    ));
    leases
        .replace("gpu-reaper-controller", &Default::default(), &lease)
        .await
        .unwrap();
    wait_until(
        "the old leader's cycle to end",
        Duration::from_secs(60),
        || common::http_ok(port, "/readyz"),
    )
    .await;
    let log = std::fs::read_to_string(&log_path).unwrap();
    let reclaimed_by_a: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| replicas(&sim, n) == 0)
        .collect();
    assert_eq!(
        reclaimed_by_a.len(),
        1,
        "the old leader acted after losing the Lease: {log}"
    );
    assert!(log.contains("lost the Lease during the cycle"), "{log}");

    // The new leader acts on the rest, and nothing is acted on twice.
    let out = controller(&sim, &url, 125, "b")
        .args(["--lease-duration", "60s"])
        .output()
        .await
        .unwrap();
    let log_b = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log_b}");
    // The old leader keeps running as a standby and must not act again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in names {
        assert_eq!(replicas(&sim, name), 0, "{name}: {log_b}");
        assert_eq!(
            restore_record(&sim, name),
            Some(json!({"replicas": 1, "state": "done"})),
            "{name}"
        );
        assert_eq!(
            count_events(&sim, name, "Reclaimed"),
            1,
            "{name} acted on twice: {:?}",
            events_for(&sim, name)
        );
    }
    leader.kill().await.unwrap();
    let _ = std::fs::remove_file(&log_path);
}

/// 500 workloads go idle at once under `maxPerHour: 20`: the first cycle acts on exactly
/// 20 and reports the rest rate-limited; another cycle within the hour acts on none; an
/// hour later, 20 more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_workloads_idle_at_once_get_max_per_hour_actions() {
    let names: Vec<String> = (0..500).map(|i| format!("w{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let prometheus = prometheus_with("faults-mass", &history(&idle(&refs), 190));
    let url = prometheus.url.clone();
    let sim = cluster(&refs, &policy("Enforce", "")).await;
    let reclaimed = |sim: &KubeSim| {
        sim.list("apps", "deployments", Some("ml"))
            .iter()
            .filter(|d| d["spec"]["replicas"] == 0)
            .count()
    };
    once_ok(&sim, &url, 95).await;
    let warned = sim
        .list("apps", "deployments", Some("ml"))
        .iter()
        .filter(|d| d["metadata"]["annotations"]["gpureaper.io/warned-at"] == at(95))
        .count();
    assert_eq!(warned, 500);

    let started = Instant::now();
    let log = once_ok(&sim, &url, 125).await;
    eprintln!(
        "the 500-workload cycle with 20 actions took {:?}",
        started.elapsed()
    );
    assert_eq!(reclaimed(&sim), 20);
    assert_eq!(
        log.matches("step=RateLimited(ScaleToZero)").count(),
        480,
        "the rest are reported rate-limited"
    );
    let status = sim
        .get("gpureaper.io", "gpupolicies", "", "inference")
        .unwrap()["status"]
        .clone();
    assert_eq!(status["workloads"]["governed"], 500, "{status}");

    once_ok(&sim, &url, 126).await;
    assert_eq!(reclaimed(&sim), 20, "a second cycle within the hour acted");
    once_ok(&sim, &url, 186).await;
    assert_eq!(reclaimed(&sim), 40, "the next hour's budget");
    for d in sim.list("apps", "deployments", Some("ml")) {
        if d["spec"]["replicas"] == 0 {
            let record = d["metadata"]["annotations"]["gpureaper.io/restore"]
                .as_str()
                .unwrap();
            assert_eq!(
                serde_json::from_str::<Value>(record).unwrap(),
                json!({"replicas": 1, "state": "done"})
            );
        }
    }
}

/// A Prometheus whose samples lie (NaN from a broken exporter field, negative ratios)
/// never makes a GPU idle; a Prometheus stopped between two cycles makes the policy
/// Degraded and the warned, due workload is not acted on. A truthful idle GPU beside
/// them is warned, so the test could fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_or_stopped_prometheus_makes_nothing_idle_and_nothing_acted_on() {
    let pods = vec![
        ("chat".to_string(), After::Idle),
        ("nan".to_string(), After::NaN),
        ("negative".to_string(), After::Negative),
    ];
    let prometheus = prometheus_with("faults-lying", &history(&pods, 140));
    let url = prometheus.url.clone();
    let sim = cluster(&["chat", "nan", "negative"], &policy("Enforce", "")).await;
    let log = once_ok(&sim, &url, 95).await;
    assert_eq!(
        annotation(&sim, "chat", "gpureaper.io/warned-at"),
        Some(at(95)),
        "{log}"
    );
    for liar in ["nan", "negative"] {
        assert_eq!(
            annotation(&sim, liar, "gpureaper.io/warned-at"),
            None,
            "{liar} judged idle: {log}"
        );
    }
    let status = sim
        .get("gpureaper.io", "gpupolicies", "", "inference")
        .unwrap()["status"]
        .clone();
    assert_eq!(status["workloads"]["idle"], 1, "{status}");

    // Prometheus stops between two cycles; chat is due for its action.
    drop(prometheus);
    let log = once_ok(&sim, &url, 125).await;
    for name in ["chat", "nan", "negative"] {
        assert_eq!(replicas(&sim, name), 1, "{name} acted on blind: {log}");
    }
    let degraded = condition(&sim, "Degraded");
    assert_eq!(degraded["status"], "True", "{degraded}");
    assert_eq!(degraded["reason"], "TelemetryUnavailable");
}

/// Secrets given to the controller (Slack token, Slack signing secret, SMTP password,
/// Prometheus bearer token) appear in none of its logs at debug level, nor in Events,
/// the policy status, annotations or any other object it writes — also when the Slack
/// and SMTP servers are down and their errors are logged and recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_appear_in_logs_events_status_or_annotations() {
    const SECRETS: [&str; 4] = [
        "xoxb-SECRET-slack-token-4f1c",
        "SECRET-signing-9d2e",
        "SECRET-smtp-password-77aa",
        "SECRET-prometheus-token-31b0",
    ];
    let prometheus: Prometheus = prometheus_with("faults-secrets", &history(&idle(&["chat"]), 140));
    let sim = cluster(
        &["chat"],
        &policy(
            "Enforce",
            ", channels: [Event, Slack, Email], defaultOwner: \"ana@example.com,U0123ABC\", slackChannel: \"#gpu\"",
        ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, secret: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, secret).unwrap();
        path.to_string_lossy().into_owned()
    };
    let files = [
        ("--slack-token-file", file("token", SECRETS[0])),
        ("--slack-signing-secret-file", file("signing", SECRETS[1])),
        ("--smtp-password-file", file("smtp", SECRETS[2])),
        ("--prometheus-bearer-token-file", file("bearer", SECRETS[3])),
    ];
    let closed = common::free_port().to_string();
    let mut logs = String::new();
    for minutes in [95, 125] {
        let mut command = controller(&sim, &prometheus.url, minutes, "a");
        command
            .args([
                "--slack-api-url",
                &format!("http://127.0.0.1:{closed}/api/"),
            ])
            .args(["--smtp-host", "127.0.0.1", "--smtp-port", &closed])
            .args(["--smtp-security", "starttls", "--smtp-user", "gpu-reaper"])
            .args(["--smtp-from", "gpu-reaper <gpu-reaper@example.com>"])
            .env("RUST_LOG", "debug");
        for (flag, path) in &files {
            command.args([*flag, path.as_str()]);
        }
        let out = command.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        logs.push_str(&String::from_utf8_lossy(&out.stdout));
        logs.push_str(&stderr);
    }
    // The runs did what puts text in logs and objects: warned, failed to deliver, acted.
    assert_eq!(replicas(&sim, "chat"), 0, "{logs}");
    assert!(logs.contains("notification not delivered"), "{logs}");
    let mut objects = String::new();
    for (group, plural) in [
        ("", "events"),
        ("", "configmaps"),
        ("apps", "deployments"),
        ("apps", "replicasets"),
        ("", "pods"),
        ("gpureaper.io", "gpupolicies"),
        ("coordination.k8s.io", "leases"),
    ] {
        for object in sim.list(group, plural, None) {
            objects.push_str(&object.to_string());
        }
    }
    assert!(objects.contains("NotificationsDelivered"), "{objects}");
    for secret in SECRETS {
        assert!(!logs.contains(secret), "{secret} in the logs");
        assert!(!objects.contains(secret), "{secret} in an object");
    }
}

/// The budget gate whose caches cannot sync (every GpuPolicy request fails) answers
/// reviews 503 and is not ready, so the API server applies the configuration's
/// `failurePolicy` (docs/budget-gate.md): `Fail` refuses a 16-GPU pod, `Ignore` admits it.
/// It never decides on empty caches and never panics; once the API server recovers it
/// syncs and gates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_before_its_caches_sync_answers_503_and_the_failure_policy_decides() {
    use base64::Engine;
    let gate =
        policy("Enforce", "").replace("  action:", "  admission: {mode: Enforce}\n  action:");
    let sim = cluster(&[], &gate).await;
    sim.add_fault(Fault::on("/apis/gpureaper.io/v1alpha1/gpupolicies").status(500));
    let pki = common::pki::Ca::new("faults test CA");
    let leaf = pki.leaf(&["127.0.0.1"], "gpu-reaper webhook");
    let (ca, cert, key) = (pki.pem, leaf.cert_pem, leaf.key_pem);
    // The private key's body: it must never reach the log.
    let key_body = key.lines().nth(1).unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), key).unwrap();
    let (port, probe_port) = (common::free_port(), common::free_port());
    let log_path = dir.path().join("webhook.log");
    let mut webhook = tokio::process::Command::new(BIN)
        .args(["webhook", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--probe-listen", &format!("127.0.0.1:{probe_port}")])
        .arg("--tls-cert")
        .arg(dir.path().join("tls.crt"))
        .arg("--tls-key")
        .arg(dir.path().join("tls.key"))
        .env("KUBECONFIG", sim.kubeconfig_path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until("the webhook's probes", Duration::from_secs(60), || {
        common::http_ok(probe_port, "/healthz")
    })
    .await;
    // The TLS listener may come up after the probes: wait until it accepts connections.
    wait_until("the webhook's listener", Duration::from_secs(60), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })
    .await;
    assert!(!common::http_ok(probe_port, "/readyz"), "ready before sync");

    let configuration = |failure_policy: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "gpu-reaper-budget-gate"},
            "webhooks": [{
                "name": "budget-gate.gpureaper.io",
                "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate"),
                                 "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca)},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                "failurePolicy": failure_policy,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }],
        })
        .to_string()
    };
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
               "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "16"}}}]}})
        .to_string()
    };
    let create = |manifest: String| {
        let sim = &sim;
        async move {
            let mut child = tokio::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(sim.kubeconfig_path())
                .args(["create", "-f", "-"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            {
                use tokio::io::AsyncWriteExt;
                let mut pipe = child.stdin.take().unwrap();
                pipe.write_all(manifest.as_bytes()).await.unwrap();
            }
            let out = child.wait_with_output().await.unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };

    kubectl(&sim, &["apply", "-f", "-"], Some(&configuration("Fail"))).await;
    let (created, stderr) = create(pod("big-fail")).await;
    assert!(!created, "admitted on unsynced caches under Fail");
    assert!(stderr.contains("failed calling webhook"), "{stderr}");
    kubectl(&sim, &["apply", "-f", "-"], Some(&configuration("Ignore"))).await;
    let (created, stderr) = create(pod("big-ignore")).await;
    assert!(
        created,
        "Ignore must admit while the webhook is not ready: {stderr}"
    );

    // The API server recovers: the webhook syncs and now decides (a denial, not a 503).
    sim.clear_faults();
    wait_until("the webhook to sync", Duration::from_secs(60), || {
        common::http_ok(probe_port, "/readyz")
    })
    .await;
    kubectl(&sim, &["apply", "-f", "-"], Some(&configuration("Fail"))).await;
    let (created, stderr) = create(pod("big-after")).await;
    assert!(!created, "a 16-GPU pod without attestation was admitted");
    assert!(
        stderr.contains("denied the request") && !stderr.contains("failed calling webhook"),
        "{stderr}"
    );
    assert!(
        webhook.try_wait().unwrap().is_none(),
        "the webhook exited: {}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        !log.contains(&key_body),
        "the TLS key is in the webhook's log"
    );
    webhook.kill().await.unwrap();
}

/// A proxy in front of Prometheus that answers the queries `blank` picks with an empty
/// (successful) vector and forwards every other request; its URL.
async fn lying_proxy(upstream: String, blank: fn(&str) -> bool) -> String {
    use axum::body::{Body, to_bytes};
    use axum::http::{Request, Response};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let app = axum::Router::new().fallback(move |request: Request<Body>| {
        let (client, upstream) = (client.clone(), upstream.clone());
        async move {
            let (parts, body) = request.into_parts();
            let body = to_bytes(body, 1 << 20).await.unwrap();
            let query_in = |text: &[u8]| {
                url::form_urlencoded::parse(text)
                    .find(|(k, _)| k == "query")
                    .map(|(_, v)| v.into_owned())
            };
            let query = query_in(parts.uri.query().unwrap_or_default().as_bytes())
                .or_else(|| query_in(&body))
                .unwrap_or_default();
            let json = |status: u16, body: Body| {
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap()
            };
            if blank(&query) {
                // Empty, of the type the query asks for: a bare range selector is a
                // matrix.
                let kind = if query.contains('(') {
                    "vector"
                } else {
                    "matrix"
                };
                return json(
                    200,
                    Body::from(format!(
                        r#"{{"status":"success","data":{{"resultType":"{kind}","result":[]}}}}"#
                    )),
                );
            }
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let mut forward = client.request(parts.method.clone(), format!("{upstream}{path}"));
            if let Some(content_type) = parts.headers.get("content-type") {
                forward = forward.header("content-type", content_type);
            }
            let answer = forward.body(body).send().await.unwrap();
            let status = answer.status().as_u16();
            json(status, Body::from(answer.bytes().await.unwrap()))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// One query of the read comes back empty (a proxy or a federation layer dropping it):
/// with no activity samples every GPU is blind — NoTelemetry, nothing warned — while the
/// same cluster read straight from Prometheus warns its idle workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_answer_to_the_activity_read_judges_nothing_idle() {
    let prometheus = prometheus_with("faults-empty", &history(&idle(&["chat"]), 140));
    let proxy = lying_proxy(prometheus.url.clone(), |q| {
        q.starts_with("DCGM_FI_PROF_GR_ENGINE_ACTIVE[")
    })
    .await;
    let lied_to = cluster(&["chat"], &policy("Enforce", "")).await;
    let log = once_ok(&lied_to, &proxy, 95).await;
    assert_eq!(
        annotation(&lied_to, "chat", "gpureaper.io/warned-at"),
        None,
        "{log}"
    );
    assert!(
        log.contains("workload=ml/Deployment/chat")
            && log.contains("classification=\"NoTelemetry\""),
        "{log}"
    );
    let truthful = cluster(&["chat"], &policy("Enforce", "")).await;
    once_ok(&truthful, &prometheus.url, 95).await;
    assert_eq!(
        annotation(&truthful, "chat", "gpureaper.io/warned-at"),
        Some(at(95))
    );
}

/// G4 where a real API server cannot go (the CRD's maxima refuse such an object now; one
/// written before they existed is still stored): an attestation that does not fit the
/// types is skipped with a Warning Event on it, counts toward no GPU quota, and does not
/// stop the readable ones from counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_attestation_gets_an_event_and_counts_toward_no_gpu_quota() {
    let policy = r#"
apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata: {name: gate}
spec:
  match: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ml}}}
  admission: {largeClaimGpus: 8, mode: Enforce}
"#;
    let sim = cluster(&[], policy).await;
    for (name, max) in [("good", 16u64), ("huge", 4_294_967_296)] {
        sim.seed(json!({
            "apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": name, "namespace": "ml", "generation": 1},
            "spec": {"selector": {}, "maxGpus": max, "expiresAt": "2099-01-01T00:00:00Z"},
            "status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
                "message": "ok", "lastTransitionTime": "2026-11-01T00:00:00Z"}],
                "approvedBy": "oncall", "approvedGeneration": 1},
        }))
        .unwrap();
    }
    let prometheus = prometheus_with("unreadable-attestation", &history(&[], 10));
    let log = once_ok(&sim, &prometheus.url, 10).await;
    assert!(
        log.contains("unreadable ReadinessAttestation skipped"),
        "{log}"
    );
    let quota = sim
        .get("", "resourcequotas", "ml", "gpu-reaper-gpus")
        .expect("the GPU quota is written despite the unreadable attestation");
    assert_eq!(
        quota["spec"]["hard"]["requests.nvidia.com/gpu"], "24",
        "the allowance (8) and the readable attestation (16) only: {quota}"
    );
    let events = events_for(&sim, "huge");
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "Unreadable" && note.contains("maxGpus")),
        "{events:?}"
    );
}
