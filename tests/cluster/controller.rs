//! The controller end to end on the real control plane (scripts/testenv: etcd,
//! kube-apiserver, kube-controller-manager, kube-scheduler, kwok GPU nodes): the real
//! Prometheus (Debian package) backfilled with DCGM-shaped history of the pods the
//! cluster really runs, kubectl to apply the policy, and the `gpu-reaper controller
//! --once --now …` binary run at chosen instants (a controllable clock: no test waits for
//! an idle hour to pass). Each test has a namespace, a policy (selected by
//! `--policy-selector`) and a Lease of its own, so they run side by side on one cluster
//! (tests/common/scenario.rs). What needs no process of its own (one cycle's outcome,
//! memory kept between cycles, the leadership flag) runs the stages in-process through
//! `Context::test` with the same flags, at the end of this file.

use crate::common;

use std::process::Stdio;

use common::cluster::{cluster, wait_until};
use common::scenario::{BIN, DeletePolicy, H100, Scenario, Workload, deployment, job};
use gpu_reaper::controller::context::{Context, Memory};
use gpu_reaper::controller::{audit_memory, cycle};
use serde_json::{Value, json};

/// The rest of a test policy's spec.
fn policy(mode: &str, action: &str) -> String {
    format!(
        "  mode: {mode}\n  idle: {{window: 30m, startupGrace: 20m, minCoverage: 0.8}}\n  warn: {{after: 30m}}\n  action: {action}\n"
    )
}

const SCALE_TO_ZERO: &str = "{type: ScaleToZero, after: 60m, maxPerHour: 20}";

/// Four hours at one-minute samples:
/// - Deployment chat (1 GPU): busy for the first hour, then idle;
/// - Job train (8 GPUs): GPU 0 busy throughout, GPUs 1–7 idle — busy;
/// - Deployment gappy (1 GPU): busy, then the exporter goes silent.
fn setup(test: &str, mode: &str) -> Scenario {
    let s = Scenario::start(
        test,
        |ns| {
            vec![
                Workload {
                    name: "chat",
                    manifest: deployment(ns, "chat", 1, json!({})),
                    pods: ("app=chat".into(), 1),
                },
                Workload {
                    name: "gappy",
                    manifest: deployment(ns, "gappy", 1, json!({})),
                    pods: ("app=gappy".into(), 1),
                },
                Workload {
                    name: "train",
                    manifest: job(ns, "train", 8),
                    pods: ("job-name=train".into(), 1),
                },
            ]
        },
        |dcgm, ns, pods| {
            dcgm.gpu(ns, &pods["chat"][0], 0, H100, 0..=240, |m| {
                Some(if m < 60 { 0.8 } else { 0.0 })
            });
            for g in 0..8 {
                dcgm.gpu(ns, &pods["train"][0], g, H100, 0..=240, move |_| {
                    Some(if g == 0 { 0.9 } else { 0.0 })
                });
            }
            dcgm.gpu(ns, &pods["gappy"][0], 0, H100, 0..=240, |m| {
                (m < 60).then_some(0.7)
            });
        },
    );
    s.apply_policy(&policy(mode, SCALE_TO_ZERO));
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_deployment_is_warned_then_scaled_to_zero_and_wake_brings_it_back() {
    let s = setup("scale", "Enforce");
    // 10 minutes idle: nothing yet.
    let (ok, log) = s.cycle(70, "a").await;
    assert!(ok, "{log}");
    assert!(
        s.deployment("chat")["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_none()
    );
    // 35 minutes idle: warned (annotation and Event), not acted on.
    let (ok, log) = s.cycle(95, "a").await;
    assert!(ok, "{log}");
    let d = s.deployment("chat");
    assert_eq!(
        d["metadata"]["annotations"]["gpureaper.io/warned-at"],
        s.at(95),
        "{log}"
    );
    assert_eq!(d["spec"]["replicas"], 1);
    let events = s.events_for("chat");
    assert!(
        events.iter().any(|(r, n)| r == "IdleGpus"
            && n.starts_with("1 GPU(s) idle since ")
            && n.contains(&format!(
                "kubectl annotate deployment chat -n {} gpureaper.io/snooze-until=",
                s.ns
            ))),
        "{events:?}"
    );
    // 65 minutes idle, 30 after the warning: scaled to 0 with the restore record.
    let (ok, log) = s.cycle(125, "a").await;
    assert!(ok, "{log}");
    let d = s.deployment("chat");
    assert_eq!(d["spec"]["replicas"], 0, "{log}");
    let restore: Value = serde_json::from_str(
        d["metadata"]["annotations"]["gpureaper.io/restore"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(restore, json!({"replicas": 1, "state": "done"}));
    let events = s.events_for("chat");
    assert!(
        events.iter().any(|(r, n)| r == "Reclaimed"
            && n.contains(&format!(
                "scaled {}/Deployment/chat from 1 replicas to 0",
                s.ns
            ))
            && n.contains(&format!("gpu-reaper wake {}/Deployment/chat", s.ns))),
        "{events:?}"
    );
    // The real Deployment controller takes the pod away: the GPU is free.
    s.wait_for_pods("chat", 0);

    // The 8-GPU job with one busy GPU is left alone; the gap is never idleness.
    assert!(
        s.events_for("train").is_empty(),
        "{:?}",
        s.events_for("train")
    );
    assert_eq!(s.deployment("gappy")["spec"]["replicas"], 1);
    assert!(
        s.deployment("gappy")["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_none()
    );

    // Status: governed workloads, one idle and reclaimed, Ready.
    let status = s.policy_status();
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
    assert_eq!(status["namespaceSpend"][0]["namespace"], s.ns, "{status}");
    let spent = status["namespaceSpend"][0]["spentUsd"].as_f64().unwrap();
    assert!((spent - 25.0 * 4.0 / 60.0).abs() < 1e-6, "{status}");
    assert_eq!(status["lastEvaluationTime"], s.at(125));
    // A minute later the reclaimed GPU has been off for a minute: 1/60 GPU-hour, and the
    // price of an H100 minute at the default 2.5 USD/h saved.
    let (ok, log) = s.cycle(126, "a").await;
    assert!(ok, "{log}");
    let reclaimed =
        s.deployment("chat")["metadata"]["annotations"]["gpureaper.io/reclaimed"].clone();
    assert_eq!(
        serde_json::from_str::<Value>(reclaimed.as_str().unwrap()).unwrap(),
        json!({"gpus": 1.0, "hourlyUsd": 2.5})
    );
    let status = s.policy_status();
    assert!(
        (status["reclaimedGpuHours"].as_f64().unwrap() - 1.0 / 60.0).abs() < 1e-9,
        "{status}"
    );
    assert!(
        (status["estimatedSavingsUsd"].as_f64().unwrap() - 2.5 / 60.0).abs() < 1e-9,
        "{status}"
    );
    assert_eq!(status["workloads"]["reclaimed"], 1, "{status}");
    // One idle GPU over the billed evaluations at 95 and 125 (2 min each); at 126 the
    // Deployment controller has removed the pod, so nothing idle is held any more.
    let idle = status["idleGpuHoursLast24h"].as_f64().unwrap();
    assert!((idle - 4.0 / 60.0).abs() < 1e-3, "{status}");

    // Wake restores the replicas and restarts the ladder; a new pod runs again.
    common::wake(&s.cluster.kubeconfig, &format!("{}/Deployment/chat", s.ns)).await;
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 1);
    s.wait_for_pods("chat", 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_mode_changes_nothing_and_reports_what_it_would_do() {
    let s = setup("audit", "Audit");
    let before = s.deployment("chat");
    for minute in [95, 125] {
        let (ok, log) = s.cycle(minute, "a").await;
        assert!(ok, "{log}");
    }
    let after = s.deployment("chat");
    // (Its status is the Deployment controller's to change; spec and metadata are ours.)
    for field in ["generation", "annotations", "labels"] {
        assert_eq!(
            after["metadata"][field], before["metadata"][field],
            "Audit wrote on the workload's {field}"
        );
    }
    assert_eq!(after["spec"], before["spec"], "Audit wrote on the workload");
    assert_eq!(after["spec"]["replicas"], 1);
    let events = s.events_for("chat");
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
        .cluster
        .get("configmap", Some(&s.ns), "gpu-reaper-controller-audit")
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
    let s = setup("audit-kubeconfig", "Audit");
    let (since, to) = (s.at(0), s.at(240));
    let audit = |kubeconfig: Option<String>| {
        let url = s.prometheus.url.clone();
        let (since, to) = (since.clone(), to.clone());
        async move {
            let mut command = tokio::process::Command::new(BIN);
            command.args([
                "audit",
                "--prometheus-url",
                &url,
                "--since",
                &since,
                "--to",
                &to,
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
    assert_eq!(offenders(&alone), [format!("Pod/{}", s.pods["chat"][0])]);
    assert!(alone.get("attribution").is_none(), "{alone}");
    let kubeconfig = s.cluster.kubeconfig.to_str().unwrap().to_string();
    let resolved = audit(Some(kubeconfig)).await;
    assert_eq!(offenders(&resolved), ["Deployment/chat"]);
    assert_eq!(
        resolved["attribution"],
        json!({"api_server": 3, "not_in_kube_state_metrics": 3, "gone": 0})
    );
    assert_eq!(resolved["total"]["gpu_hours"], alone["total"]["gpu_hours"]);
    // Read-only: nothing was written to the cluster.
    assert_eq!(s.deployment("chat")["metadata"]["generation"], 1);
    // A kubeconfig that cannot be read is named, with nothing reported.
    let out = tokio::process::Command::new(BIN)
        .args([
            "audit",
            "--prometheus-url",
            &s.prometheus.url,
            "--since",
            &s.at(0),
            "--to",
            &s.at(240),
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
/// process: what it knows of the server's rhythm it learns by backfilling the last 7 days
/// (`--history-backfill`'s default; Prometheus holds the 29 hours there are, the older
/// pieces are empty) from Prometheus, so the policy's `action.inference` scales it down to
/// one replica — warned first, saying so — instead of to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_controller_backfills_the_rhythm_and_scales_request_driven_inference_to_its_minimum()
 {
    let s = Scenario::start(
        "backfill",
        |ns| {
            vec![Workload {
                name: "serve",
                manifest: deployment(ns, "serve", 3, json!({})),
                pods: ("app=serve".into(), 3),
            }]
        },
        |dcgm, ns, pods| {
            for (r, pod) in pods["serve"].iter().enumerate() {
                dcgm.gpu(ns, pod, r as u32, "NVIDIA L4", 0..=(29 * 60), |m| {
                    Some(if m < 26 * 60 && m % 13 < 10 { 0.7 } else { 0.0 })
                });
            }
        },
    );
    s.apply_policy(&policy(
        "Enforce",
        "{type: ScaleToZero, after: 60m, maxPerHour: 20, inference: {minReplicas: 1}}",
    ));
    // Idle since 26:00; warned at 26:45.
    let (ok, log) = s.cycle(26 * 60 + 45, "a").await;
    assert!(ok, "{log}");
    assert!(
        log.contains("idle-span history backfilled from Prometheus"),
        "{log}"
    );
    let events = s.events_for("serve");
    let warning = events
        .iter()
        .find(|(r, _)| r == "IdleGpus")
        .unwrap_or_else(|| panic!("{events:?}\n{log}"));
    assert!(
        warning.1.contains("will scale it down to 1 replica(s) instead of zero (request-driven inference: its idle spans are short and frequent (a typical idle span under 4m)"),
        "{warning:?}"
    );
    assert_eq!(s.deployment("serve")["spec"]["replicas"], 3);
    // An hour later: scaled to one replica, not zero; the record keeps all three.
    let (ok, log) = s.cycle(27 * 60 + 50, "a").await;
    assert!(ok, "{log}");
    let after = s.deployment("serve");
    assert_eq!(after["spec"]["replicas"], 1, "{log}");
    let record: Value = serde_json::from_str(
        after["metadata"]["annotations"]["gpureaper.io/restore"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record, json!({"replicas": 3, "kept": 1, "state": "done"}));
    assert!(
        s.events_for("serve").iter().any(|(r, n)| r == "Reclaimed"
            && n.contains(&format!(
                "scaled {}/Deployment/serve from 3 replicas to 1",
                s.ns
            ))),
        "{:?}",
        s.events_for("serve")
    );
    // The Deployment controller removes the two replicas gpu-reaper took away.
    s.wait_for_pods("serve", 1);
    // `--history-backfill 0s` turns the replay off (the cycles then learn on their own).
    let (ok, log) = s
        .cycle_with(26 * 60 + 45, "a", "15s", &["--history-backfill", "0s"])
        .await;
    assert!(ok, "{log}");
    assert!(!log.contains("backfilled"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_acts() {
    let s = setup("lease", "Enforce");
    let (ok, log) = s.cycle(95, "replica-a").await;
    assert!(ok, "{log}");
    // A second replica within the lease duration is a standby: it does not evaluate.
    let (ok, log) = s.cycle(125, "replica-b").await;
    assert!(!ok);
    assert!(
        log.contains(&format!(
            "not the leader: Lease {}/gpu-reaper-controller is held by another replica",
            s.ns
        )),
        "{log}"
    );
    assert_eq!(
        s.deployment("chat")["spec"]["replicas"],
        1,
        "the standby acted"
    );
    let lease = s
        .cluster
        .get("lease", Some(&s.ns), "gpu-reaper-controller")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_once_the_leader_stops_renewing() {
    let s = setup("handover", "Enforce");
    let (ok, log) = s.cycle_with(95, "replica-a", "1s", &[]).await;
    assert!(ok, "{log}");
    // replica-a is gone; its 1 s Lease runs out.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let (ok, log) = s.cycle_with(125, "replica-b", "1s", &[]).await;
    assert!(ok, "{log}");
    let lease = s
        .cluster
        .get("lease", Some(&s.ns), "gpu-reaper-controller")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
    // The new leader carries on from the annotations: the warning replica-a wrote counts.
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 0, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wake_annotation_restores_and_an_owner_scaling_back_by_hand_restarts_the_ladder() {
    let s = setup("wake", "Enforce");
    for minute in [95, 125] {
        let (ok, log) = s.cycle(minute, "a").await;
        assert!(ok, "{log}");
    }
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 0);
    s.annotate_deployment("chat", &["gpureaper.io/wake=true"]);
    let (ok, log) = s.cycle(126, "a").await;
    assert!(ok, "{log}");
    let d = s.deployment("chat");
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
    assert!(s.events_for("chat").iter().any(|(r, n)| r == "Woken"
        && *n == format!("scaled {}/Deployment/chat back to 1 replicas", s.ns)));
    assert!(
        !s.events_for("chat")
            .iter()
            .any(|(r, _)| r == "RestoredByOwner"),
        "a wake is not an owner's scale-up"
    );

    // gappy was reclaimed earlier (record done) and its owner scaled it back by hand.
    s.annotate_deployment(
        "gappy",
        &[
            r#"gpureaper.io/restore={"replicas":1,"state":"done"}"#,
            "gpureaper.io/reaped-action=ScaleToZero",
            &format!("gpureaper.io/reaped-at={}", s.at(20)),
        ],
    );
    let (ok, log) = s.cycle(127, "a").await;
    assert!(ok, "{log}");
    let g = s.deployment("gappy");
    let annotations = g["metadata"]["annotations"].as_object().unwrap();
    assert!(
        !annotations.contains_key("gpureaper.io/reaped-at"),
        "{annotations:?}"
    );
    assert!(
        s.events_for("gappy")
            .iter()
            .any(|(r, _)| r == "RestoredByOwner"),
        "{:?}",
        s.events_for("gappy")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_controller_watches_the_cluster_and_reacts_to_a_policy_change_at_once() {
    let s = setup("running", "Audit");
    let port = common::free_port();
    // A one-hour interval: anything after the first cycle is driven by the policy watch.
    let mut child = tokio::process::Command::new(BIN)
        .args(["controller", "--interval", "1h", "--now", &s.at(125)])
        .args(s.controller_args("only", "15s"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &s.cluster.kubeconfig)
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
        s.deployment("chat")["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_none()
    );
    s.kubectl(&[
        "patch",
        "gpupolicy",
        &s.ns,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"mode":"Enforce"}}"#,
    ]);
    // Enforce now: the watch-triggered cycle records the warning on the workload.
    loop {
        let d = s.deployment("chat");
        if d["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_some()
        {
            assert_eq!(
                d["metadata"]["annotations"]["gpureaper.io/warned-at"],
                s.at(125)
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
    use gpu_reaper::api::policy::ActionType;
    use gpu_reaper::cluster::actions::{self, Outcome};
    use gpu_reaper::cluster::inventory::{ObjectKey, resolve};
    use gpu_reaper::controller::caches::Caches;
    use gpu_reaper::gpus::GpuResources;

    let c = cluster();
    c.install_crds();
    let ns = c.namespace("ml-discovery", &[]);
    let client = c.client().await;
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
    // A CRD gpu-reaper has never heard of, with /scale and an unconventional plural, and
    // one without /scale (not watched: its pod is reported under it).
    c.apply(&crd("inference.example.com", "Matrix", "matrices", true).to_string());
    c.apply(&crd("trainer.example.com", "Trainer", "trainers", false).to_string());
    c.wait_established(&[
        "matrices.inference.example.com",
        "trainers.trainer.example.com",
    ]);
    c.apply(
        &json!({"apiVersion": "inference.example.com/v1", "kind": "Matrix",
        "metadata": {"name": "mm", "namespace": ns}, "spec": {"replicas": 2}})
        .to_string(),
    );
    c.apply(
        &json!({"apiVersion": "trainer.example.com/v1", "kind": "Trainer",
        "metadata": {"name": "t", "namespace": ns}, "spec": {}})
        .to_string(),
    );
    // Pods owned by them (with their real uids: the garbage collector deletes pods whose
    // owner does not exist).
    let owned_pod = |name: &str, owner: (&str, &str, &str)| {
        let uid = c.kubectl(
            &["get", owner.2, "-n", &ns, "-o", "jsonpath={.metadata.uid}"],
            None,
        );
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": [
                {"apiVersion": owner.0, "kind": owner.1, "name": owner.2.split('/').nth(1).unwrap(), "uid": uid, "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        .to_string()
    };
    c.apply(&owned_pod(
        "mm-0",
        (
            "inference.example.com/v1",
            "Matrix",
            "matrices.inference.example.com/mm",
        ),
    ));
    c.apply(&owned_pod(
        "t-0",
        (
            "trainer.example.com/v1",
            "Trainer",
            "trainers.trainer.example.com/t",
        ),
    ));
    // A ReplicaSet whose two pods share an existing ResourceClaim of 2 GPUs (nothing
    // allocates it here, so they stay Pending; they hold the claim all the same).
    c.apply(&json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}).to_string());
    c.apply(&json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "serve-1", "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "serve"}}, "template": {"metadata": {"labels": {"app": "serve"}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimName": "shared"}]}}}}).to_string());
    wait_until("the ReplicaSet's two pods", || {
        c.list("pods", &ns, Some("app=serve")).len() == 2
    });
    let serve_pod = c.list("pods", &ns, Some("app=serve"))[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    c.running_pods(&ns, "!app", 2);
    let caches = Caches::start(&client, &[("apps", "v1", "ReplicaSet", "replicasets")], "").await;
    tokio::time::timeout(std::time::Duration::from_secs(30), caches.wait_synced())
        .await
        .expect("watches synced");
    let (pods, owners, _, _) = caches.read(&GpuResources::default(), jiff::Timestamp::now());
    let workloads = resolve(pods, &owners);
    let find = |name: &str| {
        workloads
            .iter()
            .find(|w| {
                w.pods
                    .iter()
                    .any(|p| p.meta.name == name && p.meta.namespace == ns)
            })
            .unwrap_or_else(|| panic!("{name} not inventoried: {workloads:#?}"))
    };
    let matrix = find("mm-0");
    assert_eq!(
        matrix.root.key(),
        ObjectKey::new("inference.example.com/v1", "Matrix", &ns, "mm")
    );
    assert_eq!(matrix.unwatched_owner, None);
    let trainer = find("t-0");
    assert_eq!(trainer.root.kind, "Pod");
    assert_eq!(
        trainer.unwatched_owner.as_ref().map(|o| o.kind.as_str()),
        Some("Trainer")
    );
    let serve = find(&serve_pod);
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
        Outcome::Done(format!("scaled {ns}/Matrix/mm from 2 replicas to 0"))
    );
    assert_eq!(
        c.get("matrices.inference.example.com", Some(&ns), "mm")
            .unwrap()["spec"]["replicas"],
        0
    );
    c.kubectl(&["delete", "namespace", &ns, "--wait=false"], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_renews_its_lease_between_evaluations() {
    let s = setup("renew", "Audit");
    let port = common::free_port();
    // Evaluations an hour apart, a Lease of 2 s: only renewing on its own clock keeps it.
    let _leader = tokio::process::Command::new(BIN)
        .args(["controller", "--interval", "1h"])
        .args(s.controller_args("a", "2s"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &s.cluster.kubeconfig)
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
    let (ok, log) = s.cycle_with(125, "b", "2s", &[]).await;
    assert!(
        !ok,
        "the standby took a Lease its leader keeps renewing: {log}"
    );
    assert!(log.contains("not the leader"), "{log}");
    let lease = s
        .cluster
        .get("lease", Some(&s.ns), "gpu-reaper-controller")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "a");
}

/// SIGTERM (a rollout, a drain): the leader stops at a safe point, exits 0 and releases
/// its Lease, so the standby takes it at its next attempt — before the Lease the leader
/// last renewed would have run out (a whole minute here), which it could not do if the
/// Lease were merely left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_lease_and_the_standby_takes_over_before_it_would_expire() {
    let s = setup("sigterm", "Audit");
    let dir = tempfile::tempdir().unwrap();
    let start = |identity: &str| {
        let port = common::free_port();
        let log = dir.path().join(format!("{identity}.log"));
        let child = tokio::process::Command::new(BIN)
            .args(["controller", "--interval", "1h"])
            .args(s.controller_args(identity, "60s"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("KUBECONFIG", &s.cluster.kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        (child, port, log)
    };
    let lease = || {
        s.cluster
            .get("lease", Some(&s.ns), "gpu-reaper-controller")
            .map(|l| l["spec"].clone())
            .unwrap_or(Value::Null)
    };
    let (mut leader, leader_port, leader_log) = start("a");
    wait_until("a to lead and be ready", || {
        lease()["holderIdentity"] == "a" && common::http_ok(leader_port, "/readyz")
    });
    let (_standby, standby_port, standby_log) = start("b");
    wait_until("the standby to be ready", || {
        common::http_ok(standby_port, "/readyz")
    });
    let held = lease();
    assert_eq!(held["holderIdentity"], "a");
    let last_renewal: jiff::Timestamp = held["renewTime"].as_str().unwrap().parse().unwrap();

    let pid = leader.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(std::time::Duration::from_secs(60), leader.wait())
        .await
        .expect("the leader stops within a minute of SIGTERM")
        .unwrap();
    let log = std::fs::read_to_string(&leader_log).unwrap();
    assert!(status.success(), "a clean stop exits 0: {status:?}\n{log}");
    assert!(log.contains("Lease released"), "{log}");

    wait_until("the standby to take the Lease", || {
        lease()["holderIdentity"] == "b"
    });
    let taken = lease();
    let acquired: jiff::Timestamp = taken["acquireTime"].as_str().unwrap().parse().unwrap();
    assert!(
        acquired < last_renewal + jiff::SignedDuration::from_secs(60),
        "b took the Lease at {acquired}, not before a's last renewal ({last_renewal}) ran out: {taken}\n{}",
        std::fs::read_to_string(&standby_log).unwrap_or_default()
    );
    assert_eq!(taken["leaseTransitions"], 1);
}

/// Invariant 7 on a real cluster: once the Deployment controller has removed the pods of
/// a workload scaled to zero, that action still counts against `maxPerHour`, so a second
/// idle workload waits for the hour to pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_per_hour_counts_an_action_whose_pods_are_already_gone() {
    let s = Scenario::start(
        "per-hour",
        |ns| {
            ["first", "second"]
                .into_iter()
                .map(|name| Workload {
                    name,
                    manifest: deployment(ns, name, 1, json!({})),
                    pods: (format!("app={name}"), 1),
                })
                .collect()
        },
        |dcgm, ns, pods| {
            for name in ["first", "second"] {
                dcgm.gpu(ns, &pods[name][0], 0, H100, 0..=240, |m| {
                    Some(if m < 60 { 0.8 } else { 0.0 })
                });
            }
        },
    );
    s.apply_policy(&policy(
        "Enforce",
        "{type: ScaleToZero, after: 60m, maxPerHour: 1}",
    ));
    for minute in [95, 125] {
        let (ok, log) = s.cycle(minute, "a").await;
        assert!(ok, "{log}");
    }
    let replicas = |name: &str| s.deployment(name)["spec"]["replicas"].as_i64().unwrap();
    assert_eq!(
        replicas("first") + replicas("second"),
        1,
        "one action in the hour"
    );
    let (reaped, kept) = if replicas("first") == 0 {
        ("first", "second")
    } else {
        ("second", "first")
    };
    s.wait_for_pods(reaped, 0);
    // A minute later the reaped one has no pods, so it is not in the inventory any more.
    let (ok, log) = s.cycle(126, "a").await;
    assert!(ok, "{log}");
    assert_eq!(
        replicas(kept),
        1,
        "maxPerHour: 1 allowed a second action: {log}"
    );
    // Past the hour, the second one goes too.
    let (ok, log) = s.cycle(186, "a").await;
    assert!(ok, "{log}");
    assert_eq!(replicas(kept), 0, "{log}");
}

/// `gpu-reaper explain TARGET --now AT` with this scenario's Prometheus and policy
/// selector, as JSON, each replaced by the same flag in `extra`: (exit code, stdout,
/// stderr).
async fn explain(s: &Scenario, target: &str, at: &str, extra: &[&str]) -> (i32, String, String) {
    let selector = format!("gpureaper.io/test={}", s.ns);
    let base = [
        ("--format", "json"),
        ("--prometheus-url", s.prometheus.url.as_str()),
        ("--scrape-interval", "1m"),
        ("--policy-selector", selector.as_str()),
        ("--lease-namespace", s.ns.as_str()),
    ];
    let mut args = vec!["explain", target, "--now", at];
    for (flag, value) in base {
        if !extra.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend(extra);
    let out = tokio::process::Command::new(BIN)
        .args(&args)
        .env("KUBECONFIG", &s.cluster.kubeconfig)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `explain`'s JSON answer for `target` at `at`, which must succeed.
async fn explained(s: &Scenario, target: &str, at: &str) -> Value {
    let (code, out, err) = explain(s, target, at, &[]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `gpu-reaper controller --once` at the instant `at` (RFC 3339).
async fn cycle_at(s: &Scenario, at: &str) -> String {
    let out = tokio::process::Command::new(BIN)
        .args(["controller", "--once", "--now", at])
        .args(s.controller_args("a", "15s"))
        .env("KUBECONFIG", &s.cluster.kubeconfig)
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    log
}

fn second_before(at: &str) -> String {
    (at.parse::<jiff::Timestamp>().unwrap() - jiff::SignedDuration::from_secs(1)).to_string()
}

/// `gpu-reaper explain` on a Deployment, a Job and a RayCluster, from the controller's
/// own decision step: the time it gives for the next step is when the controller takes
/// it. Its window (20m) is shorter than warn.after (30m), so an idle workload waits for
/// its warning with a time to wait for:
/// - Deployment chat (1 GPU): busy for the first hour, then idle;
/// - Job train (2 GPUs): GPU 0 busy throughout;
/// - RayCluster ray (its pod, 1 GPU): busy for 100 minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_tells_what_the_controller_will_do_and_when_and_it_does_it_then() {
    let c = cluster();
    c.kubectl(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(
            &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "rayclusters.ray.io"},
                "spec": {"group": "ray.io", "scope": "Namespaced",
                         "names": {"kind": "RayCluster", "plural": "rayclusters", "singular": "raycluster", "listKind": "RayClusterList"},
                         "versions": [{"name": "v1", "served": true, "storage": true,
                                       "subresources": {"status": {}},
                                       "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
            .to_string(),
        ),
    );
    c.wait_established(&["rayclusters.ray.io"]);
    let s = Scenario::start(
        "explain",
        |ns| {
            // The RayCluster first: its pod names it by its real uid (the garbage
            // collector deletes pods whose owner does not exist).
            c.apply(
                &json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
                    "metadata": {"name": "ray", "namespace": ns}, "spec": {}})
                .to_string(),
            );
            let uid = c.kubectl(
                &[
                    "get",
                    "rayclusters.ray.io/ray",
                    "-n",
                    ns,
                    "-o",
                    "jsonpath={.metadata.uid}",
                ],
                None,
            );
            let ray_pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "ray-gpu-0", "namespace": ns, "labels": {"ray.io/cluster": "ray"},
                             "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": "ray", "uid": uid, "controller": true}]},
                "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
            vec![
                Workload {
                    name: "chat",
                    manifest: deployment(ns, "chat", 1, json!({})),
                    pods: ("app=chat".into(), 1),
                },
                Workload {
                    name: "train",
                    manifest: job(ns, "train", 2),
                    pods: ("job-name=train".into(), 1),
                },
                Workload {
                    name: "ray",
                    manifest: ray_pod.to_string(),
                    pods: ("ray.io/cluster=ray".into(), 1),
                },
            ]
        },
        |dcgm, ns, pods| {
            dcgm.gpu(ns, &pods["chat"][0], 0, H100, 0..=240, |m| {
                Some(if m < 60 { 0.8 } else { 0.0 })
            });
            for g in 0..2 {
                dcgm.gpu(ns, &pods["train"][0], g, H100, 0..=240, move |_| {
                    Some(if g == 0 { 0.9 } else { 0.0 })
                });
            }
            dcgm.gpu(ns, &pods["ray"][0], 0, H100, 0..=240, |m| {
                Some(if m < 100 { 0.6 } else { 0.0 })
            });
        },
    );
    s.apply_policy(
        "  mode: Enforce\n  idle: {window: 20m, startupGrace: 20m, minCoverage: 0.8}\n  warn: {after: 30m}\n  action: {type: ScaleToZero, after: 60m, maxPerHour: 20}\n",
    );
    let ns = &s.ns;

    // 25 minutes idle: nothing yet; the warning has a time.
    let chat = explained(&s, &format!("{ns}/Deployment/chat"), &s.at(85)).await;
    let d = &chat["decision"];
    assert_eq!(d["classification"], "Idle/Unused", "{chat:#}");
    assert_eq!(d["step"], "Nothing", "{chat:#}");
    assert_eq!(d["nextStep"], "Warn", "{chat:#}");
    assert_eq!(chat["policy"]["name"], ns.as_str());
    assert_eq!(chat["workload"]["apiVersion"], "apps/v1");
    assert_eq!(chat["gpus"].as_array().unwrap().len(), 1, "{chat:#}");
    assert_eq!(chat["gpus"][0]["model"], H100);
    assert_eq!(chat["sources"]["historyBackfill"], "168h");
    let warn_at = d["nextStepAt"].as_str().unwrap().to_string();
    assert!(warn_at > s.at(85) && warn_at < s.at(120), "{warn_at}");
    // The other order of the target reads the same.
    let again = explained(&s, &format!("Deployment/{ns}/chat"), &s.at(85)).await;
    assert_eq!(again["decision"]["nextStepAt"], warn_at.as_str());

    // The controller a second before: no warning; at it: the warning.
    let log = cycle_at(&s, &second_before(&warn_at)).await;
    let annotations = |s: &Scenario| s.deployment("chat")["metadata"]["annotations"].clone();
    assert!(
        annotations(&s).get("gpureaper.io/warned-at").is_none(),
        "{log}"
    );
    let log = cycle_at(&s, &warn_at).await;
    assert_eq!(
        annotations(&s)["gpureaper.io/warned-at"],
        warn_at.as_str(),
        "{log}"
    );

    // Warned: the next step is the action, with its time; explain reads the warning.
    let chat = explained(&s, &format!("{ns}/Deployment/chat"), &warn_at).await;
    let d = &chat["decision"];
    assert_eq!(d["nextStep"], "Act", "{chat:#}");
    assert_eq!(chat["state"]["warnedAt"], warn_at.as_str());
    assert_eq!(chat["policy"]["actionForKind"], "ScaleToZero");
    let act_at = d["nextStepAt"].as_str().unwrap().to_string();
    assert!(act_at > warn_at, "{act_at}");
    let log = cycle_at(&s, &second_before(&act_at)).await;
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 1, "{log}");
    let log = cycle_at(&s, &act_at).await;
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 0, "{log}");

    // Reclaimed, its pod gone: it holds no GPUs, nothing is judged, the record is shown.
    s.wait_for_pods("chat", 0);
    let chat = explained(&s, &format!("{ns}/Deployment/chat"), &act_at).await;
    assert_eq!(chat["decision"], Value::Null, "{chat:#}");
    assert_eq!(chat["state"]["reapedAt"], act_at.as_str(), "{chat:#}");

    // The Job: one of its two GPUs busy, so busy; both GPUs listed; suspended, not scaled.
    let train = explained(&s, &format!("{ns}/Job/train"), &s.at(85)).await;
    assert_eq!(train["decision"]["classification"], "Active", "{train:#}");
    assert_eq!(train["decision"]["nextStepAt"], Value::Null);
    assert_eq!(train["gpus"].as_array().unwrap().len(), 2, "{train:#}");
    assert_eq!(train["policy"]["actionForKind"], "Suspend");

    // The RayCluster, found through its pod's owner (no --api-version needed): busy at
    // 85, idle past its window at 125, its warning due 30 minutes after its last activity.
    let ray = explained(&s, &format!("{ns}/RayCluster/ray"), &s.at(85)).await;
    assert_eq!(ray["workload"]["apiVersion"], "ray.io/v1", "{ray:#}");
    assert_eq!(ray["decision"]["classification"], "Active", "{ray:#}");
    let ray = explained(&s, &format!("{ns}/RayCluster/ray"), &s.at(125)).await;
    assert_eq!(ray["decision"]["classification"], "Idle/Unused", "{ray:#}");
    assert_eq!(ray["decision"]["nextStep"], "Warn", "{ray:#}");

    // The text page says the same for people.
    let (code, text, err) = explain(
        &s,
        &format!("{ns}/Job/train"),
        &s.at(85),
        &["--format", "text"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("class       Active"), "{text}");

    // Bad input: a clear sentence naming what to do, exit code 2.
    let bad = [
        (format!("{ns}/Deployment/nope"), vec![], "--workload: "),
        (format!("{ns}/Widget/nope"), vec![], "--api-version"),
        (
            format!("{ns}/Deployment/chat"),
            vec!["--policy-selector", "gpureaper.io/test=nobody"],
            "is not governed by any GpuPolicy",
        ),
        (
            format!("{ns}/Job/train"),
            vec![
                "--prometheus-url",
                "http://127.0.0.1:9",
                "--prometheus-retries",
                "0",
            ],
            "--prometheus-url: Prometheus could not answer",
        ),
        ("train".to_string(), vec![], "<namespace>/<kind>/<name>"),
    ];
    for (target, extra, says) in bad {
        let (code, out, err) = explain(&s, &target, &s.at(85), &extra).await;
        assert_eq!(code, 2, "{target}: {out}{err}");
        assert!(err.contains(says), "{target}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// GET `path` on 127.0.0.1:`port`; the body.
fn http_body(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map_or(out.clone(), |(_, body)| body.to_string())
}

/// Issue #35: one GpuPolicy written under a newer CRD (an `action.type` this gpu-reaper
/// does not know) is set aside — an Event on it naming the field, the value and the fix,
/// Degraded in its status, the gauge — while the normal policy beside it still warns
/// (the running controller, through its watches: it gets ready) and acts (`--once`,
/// through a listing). The newer policy still wins the Job it matches at a higher
/// priority, so the normal policy does not take it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_from_a_newer_crd_is_set_aside_with_an_event_and_the_other_policies_go_on() {
    // Written while a newer CRD is installed, which is then put back (objects already
    // stored are kept as they are). No other test of this binary uses the cluster
    // meanwhile: the API server re-initializes the GpuPolicy storage after each CRD change.
    let cluster = cluster();
    cluster.install_crds();
    let newer = format!("newer-{}", common::cluster::unique());
    let _delete = DeletePolicy(cluster, newer.clone());
    common::scenario::apply_under_crd(
        cluster,
        &common::scenario::newer_policy_crd(),
        &format!(
            "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {newer}}}\nspec:\n  action: {{type: Hibernate, after: 60m}}\n"
        ),
    );
    let s = setup("newer", "Enforce");
    let ns = s.ns.clone();
    // Aimed at this scenario under the committed CRD: the API server lets an update keep
    // a value the schema no longer allows (validation ratcheting).
    s.kubectl(&[
        "patch",
        "gpupolicy",
        &newer,
        "--type",
        "merge",
        "-p",
        &json!({
            "metadata": {"labels": {"gpureaper.io/test": ns}},
            "spec": {"priority": 10, "match": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "kinds": ["Job"]}},
        })
        .to_string(),
    ]);

    // The running controller: its watches sync and it gets ready; its first cycle warns.
    let port = common::free_port();
    let mut child = tokio::process::Command::new(BIN)
        .args(["controller", "--interval", "1h", "--now", &s.at(95)])
        .args(s.controller_args("a", "15s"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("KUBECONFIG", &s.cluster.kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_until(
        "the controller to get ready beside an unreadable policy",
        || common::http_ok(port, "/readyz"),
    );
    wait_until("the warning on chat", || {
        s.deployment("chat")["metadata"]["annotations"]["gpureaper.io/warned-at"] == s.at(95)
    });
    let metrics = http_body(port, "/metrics");
    assert!(
        metrics.contains("gpu_reaper_unreadable_objects{kind=\"GpuPolicy\"} 1"),
        "{metrics}"
    );
    child.kill().await.unwrap();

    // One cycle of `--once` (a listing): the normal policy acts.
    let (ok, log) = s.cycle(125, "a").await;
    assert!(ok, "{log}");
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 0, "{log}");
    assert!(log.contains("GpuPolicy not evaluated"), "{log}");

    // The Event on the newer policy (cluster-scoped: its Events are in `default`).
    let fix = "spec.action.type: unknown value \"Hibernate\" (this gpu-reaper knows ScaleToZero, Suspend, Evict, None): upgrade gpu-reaper or change the value";
    let events: Vec<(String, String)> = s
        .cluster
        .list("events", "default", None)
        .into_iter()
        .filter(|e| {
            e["involvedObject"]["name"] == newer.as_str()
                && e["involvedObject"]["kind"] == "GpuPolicy"
                && e["reportingComponent"] == "gpu-reaper"
        })
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or("").to_string(),
                e["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "Unreadable" && note.contains(fix)),
        "{events:?}"
    );
    // Its status: Degraded, not Ready.
    let status = s.cluster.get("gpupolicy", None, &newer).unwrap()["status"].clone();
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["status"], "True", "{status}");
    assert_eq!(degraded["reason"], "Unreadable", "{status}");
    assert_eq!(degraded["message"], fix, "{status}");
    assert_eq!(condition(&status, "Ready")["status"], "False", "{status}");

    // The normal policy: evaluated and Ready; the Job stays the newer policy's.
    let status = s.policy_status();
    assert_eq!(condition(&status, "Ready")["status"], "True", "{status}");
    assert_eq!(status["workloads"]["governed"], 2, "{status}");
    let overlapping = condition(&status, "Overlapping");
    assert!(
        overlapping["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{ns}/Job/train (by {newer})")),
        "{status}"
    );
}

/// Found by the `object` fuzz target (2026-12-04): a GpuPolicy stored under an older CRD
/// without the CEL rules on durations (kept as it is through the upgrade), with
/// `idle.window` too long for any clock, made kube-core's parser panic in the controller's
/// policy reader — every cycle, so the controller crash-looped and no policy was
/// enforced. Now that policy is set aside with an Event and Degraded naming
/// `spec.idle.window`, and the policy beside it warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_with_a_duration_past_any_clock_is_set_aside_and_the_others_go_on() {
    let cluster = cluster();
    cluster.install_crds();
    let bad = format!("clock-{}", common::cluster::unique());
    let _delete = DeletePolicy(cluster, bad.clone());
    common::scenario::apply_under_crd(
        cluster,
        &common::scenario::older_policy_crd(),
        &format!(
            "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {bad}, labels: {{gpureaper.io/test: {bad}}}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{gpureaper.io/none: x}}}}}}\n  idle: {{window: 3{}0m}}\n",
            "1".repeat(110)
        ),
    );
    let s = setup("clock", "Enforce");
    // One cycle of the controller, selecting this scenario's policy and the bad one (an
    // update of the bad one, e.g. a label, is refused by the committed CRD's rules).
    let mut args = s.controller_args("a", "15s");
    let selector = args.iter().position(|a| a == "--policy-selector").unwrap() + 1;
    args[selector] = format!("gpureaper.io/test in ({},{bad})", s.ns);
    let out = tokio::process::Command::new(BIN)
        .args(["controller", "--once", "--now", &s.at(95)])
        .args(&args)
        .env("KUBECONFIG", &s.cluster.kubeconfig)
        .env("RUST_LOG", "info")
        .output()
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "the controller stopped: {log}");
    assert_eq!(
        s.deployment("chat")["metadata"]["annotations"]["gpureaper.io/warned-at"],
        s.at(95),
        "{log}"
    );
    assert!(log.contains("GpuPolicy not evaluated"), "{log}");
    let says = "spec.idle.window: duration";
    let events: Vec<String> = s
        .cluster
        .list("events", "default", None)
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == bad.as_str() && e["reason"] == "Unreadable")
        .filter_map(|e| e["message"].as_str().map(str::to_string))
        .collect();
    assert!(events.iter().any(|m| m.contains(says)), "{events:?}");
    // (Its Degraded condition cannot be written: the API server refuses any write to this
    // object, status included, as its rules fail on the stored spec; the Event and the
    // log say it.)
}

// The stages in-process: the same scenarios, run through `Context::test` and
// `cycle::evaluate` against the same control plane and Prometheus (no binary), so a
// test can keep one `Memory` between cycles, read the metrics, or take the Lease away
// mid-run.

/// A context with this scenario's controller flags (`identity`, a 15 s Lease) plus
/// `extra`, and its memory as a controller starting to lead reads it.
async fn in_process(s: &Scenario, identity: &str, extra: &[&str]) -> (Context, Memory) {
    let mut flags = s.controller_args(identity, "15s");
    flags.extend(extra.iter().map(|f| f.to_string()));
    let config = gpu_reaper::commands::controller::config_from_flags(flags).unwrap();
    let ctx = Context::test(s.cluster.client().await, config).unwrap();
    let mut memory = Memory::new(&ctx);
    memory.audit = audit_memory::load(&ctx).await;
    (ctx, memory)
}

/// One evaluation as of `minutes` after T0.
async fn evaluate(s: &Scenario, ctx: &Context, memory: &mut Memory, minutes: i64) {
    let now = s.at(minutes).parse().unwrap();
    cycle::evaluate(ctx, memory, now).await.unwrap();
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("no conditions: {status}"))
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_}: {status}"))
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_the_stages_warn_then_scale_an_idle_deployment_to_zero_and_count_it() {
    let s = setup("stages", "Enforce");
    let (ctx, mut memory) = in_process(&s, "a", &[]).await;
    evaluate(&s, &ctx, &mut memory, 70).await;
    assert!(
        s.deployment("chat")["metadata"]["annotations"]
            .get("gpureaper.io/warned-at")
            .is_none()
    );
    evaluate(&s, &ctx, &mut memory, 95).await;
    let d = s.deployment("chat");
    assert_eq!(
        d["metadata"]["annotations"]["gpureaper.io/warned-at"],
        s.at(95)
    );
    assert_eq!(d["spec"]["replicas"], 1);
    let events = s.events_for("chat");
    assert!(
        events.iter().any(|(r, n)| r == "IdleGpus"
            && n.starts_with("1 GPU(s) idle since ")
            && n.contains(" (Idle/Unused, 2.50 USD/h). gpu-reaper will ScaleToZero it from ")),
        "{events:?}"
    );
    evaluate(&s, &ctx, &mut memory, 125).await;
    let d = s.deployment("chat");
    assert_eq!(d["spec"]["replicas"], 0);
    assert_eq!(
        serde_json::from_str::<Value>(
            d["metadata"]["annotations"]["gpureaper.io/restore"]
                .as_str()
                .unwrap()
        )
        .unwrap(),
        json!({"replicas": 1, "state": "done"})
    );
    assert!(
        s.events_for("chat").iter().any(|(r, n)| r == "Reclaimed"
            && n.ends_with(&format!(
                "; restore with `gpu-reaper wake {}/Deployment/chat`",
                s.ns
            ))),
        "{:?}",
        s.events_for("chat")
    );
    // The busy job and the silent exporter: nothing.
    assert!(s.events_for("train").is_empty());
    assert_eq!(s.deployment("gappy")["spec"]["replicas"], 1);
    let status = s.policy_status();
    assert_eq!(status["workloads"]["governed"], 3, "{status}");
    assert_eq!(status["workloads"]["idle"], 1, "{status}");
    assert_eq!(status["workloads"]["warned"], 1, "{status}");
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert_eq!(condition(&status, "Degraded")["status"], "False");
    assert_eq!(status["lastEvaluationTime"], s.at(125));
    let metrics = ctx.metrics.encode();
    assert!(
        metrics.contains("gpu_reaper_actions_total{action=\"ScaleToZero\",result=\"done\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "gpu_reaper_governed_gpus{{policy=\"{}\"}} 10",
            s.ns
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("gpu_reaper_evaluation_duration_seconds_count 3"),
        "{metrics}"
    );
}

/// The leadership flag the renewal task keeps: a replica that lost the Lease still
/// warns and writes status but takes no action until it leads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_a_replica_that_lost_the_lease_mid_run_does_not_act_until_it_leads_again() {
    let s = setup("stages-lease", "Enforce");
    let (ctx, mut memory) = in_process(&s, "a", &[]).await;
    evaluate(&s, &ctx, &mut memory, 95).await;
    assert_eq!(
        s.deployment("chat")["metadata"]["annotations"]["gpureaper.io/warned-at"],
        s.at(95)
    );
    ctx.set_leading(false);
    evaluate(&s, &ctx, &mut memory, 125).await;
    assert_eq!(
        s.deployment("chat")["spec"]["replicas"],
        1,
        "acted without the Lease"
    );
    assert!(
        !s.events_for("chat").iter().any(|(r, _)| r == "Reclaimed"),
        "{:?}",
        s.events_for("chat")
    );
    assert_eq!(s.policy_status()["lastEvaluationTime"], s.at(125));
    assert!(ctx.metrics.encode().contains("gpu_reaper_leader 0"));
    ctx.set_leading(true);
    evaluate(&s, &ctx, &mut memory, 126).await;
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 0);
}

/// Audit mode through its memory: the warning is remembered in the ConfigMap, so a
/// controller starting over with it reports what it would do instead of warning again,
/// and nothing is written on the workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_audit_mode_remembers_its_warning_in_its_configmap_and_changes_nothing() {
    let s = setup("stages-audit", "Audit");
    let before = s.deployment("chat");
    let (ctx, mut memory) = in_process(&s, "a", &[]).await;
    evaluate(&s, &ctx, &mut memory, 95).await;
    let state = s
        .cluster
        .get("configmap", Some(&s.ns), "gpu-reaper-controller-audit")
        .expect("the Audit memory is saved");
    assert!(
        state["data"]["state.json"]
            .as_str()
            .unwrap()
            .contains("\"name\":\"chat\""),
        "{state}"
    );
    // A new leader: a fresh memory, read back from the ConfigMap.
    let (ctx, mut memory) = in_process(&s, "b", &[]).await;
    evaluate(&s, &ctx, &mut memory, 125).await;
    let events = s.events_for("chat");
    assert_eq!(
        events.iter().filter(|(r, _)| r == "IdleGpus").count(),
        1,
        "{events:?}"
    );
    assert!(
        events.iter().any(|(r, n)| r == "WouldReclaim"
            && n.starts_with("Audit mode: would ScaleToZero now (")
            && n.ends_with("); nothing was changed.")),
        "{events:?}"
    );
    assert!(
        ctx.metrics
            .encode()
            .contains("gpu_reaper_actions_total{action=\"ScaleToZero\",result=\"would_act\"} 1")
    );
    let after = s.deployment("chat");
    assert_eq!(
        after["metadata"]["annotations"],
        before["metadata"]["annotations"]
    );
    assert_eq!(after["spec"], before["spec"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_down_marks_the_policy_degraded_and_acts_on_nothing() {
    let mut s = setup("down", "Enforce");
    s.prometheus.url = "http://127.0.0.1:9".into();
    let (ctx, mut memory) = in_process(&s, "a", &[]).await;
    // The cycle itself succeeds: a telemetry failure is the policy's, not the loop's.
    evaluate(&s, &ctx, &mut memory, 125).await;
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 1);
    let status = s.policy_status();
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["status"], "True", "{status}");
    assert_eq!(degraded["reason"], "TelemetryUnavailable");
    assert_eq!(condition(&status, "Ready")["status"], "False", "{status}");
    assert!(ctx.metrics.encode().contains(&format!(
        "gpu_reaper_telemetry_errors_total{{policy=\"{}\"}} 1",
        s.ns
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_after_the_restore_record_finishes_the_scale_on_its_next_cycle() {
    let s = setup("resume", "Enforce");
    // What a run killed between its two writes leaves behind.
    s.annotate_deployment(
        "chat",
        &[
            r#"gpureaper.io/restore={"replicas":1,"state":"pending"}"#,
            "gpureaper.io/reaped-action=ScaleToZero",
            &format!("gpureaper.io/reaped-at={}", s.at(124)),
        ],
    );
    // The next controller: nothing remembered, only what is on the workload.
    let (ctx, mut memory) = in_process(&s, "a", &[]).await;
    evaluate(&s, &ctx, &mut memory, 126).await;
    let d = s.deployment("chat");
    assert_eq!(d["spec"]["replicas"], 0);
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
        s.at(124),
        "one action, not two"
    );
    assert!(
        s.events_for("chat").iter().any(|(r, n)| r == "Reclaimed"
            && *n == format!("scaled {}/Deployment/chat from 1 replicas to 0", s.ns)),
        "{:?}",
        s.events_for("chat")
    );
}

/// `action.preWarm` through the stages: a Deployment scaled to zero whose history says
/// it is busy again at the same time every past day is woken 15 minutes before that
/// time — not earlier — through the `gpureaper.io/wake` path (replicas back, the ladder
/// restarted), with a `PreWarmed` Event that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_a_pre_warm_wakes_a_scaled_to_zero_deployment_before_its_usual_hour() {
    use gpu_reaper::cluster::inventory::ObjectKey;
    use gpu_reaper::engine::{Histories, Rules};
    use jiff::{SignedDuration, Timestamp};
    let s = setup("prewarm", "Enforce");
    s.apply_policy(&policy(
        "Enforce",
        "{type: ScaleToZero, after: 60m, maxPerHour: 20, preWarm: {before: 15m, minDays: 2}}",
    ));
    let (ctx, mut memory) = in_process(&s, "a", &[]).await;
    // What the controller would have learnt over the past week: chat busy again at the
    // time of day of minute 210 every day (a pause of 12 hours ending there).
    let stored = s.cluster.get("gpupolicy", None, &s.ns).unwrap();
    let policy: gpu_reaper::api::GpuPolicy = serde_json::from_value(stored).unwrap();
    let rules = Rules::from_spec(&policy.spec);
    let mut history: Histories<ObjectKey> = Histories::new(rules.risk);
    let key = ObjectKey::new("apps/v1", "Deployment", &s.ns, "chat");
    let usual: Timestamp = s.at(210).parse().unwrap();
    for days in (1..=7).rev() {
        let back = usual - SignedDuration::from_hours(24 * days);
        let minute = SignedDuration::from_mins(1);
        history.busy(&key, back - SignedDuration::from_hours(12), minute);
        history.busy(&key, back, minute);
        history.busy(
            &key,
            back + SignedDuration::from_hours(8),
            SignedDuration::from_hours(24),
        );
    }
    memory.histories.insert(s.ns.clone(), history);
    for minute in [70, 95, 125] {
        evaluate(&s, &ctx, &mut memory, minute).await;
    }
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 0);
    wait_until("chat's pod to go", || {
        s.cluster.list("pods", &s.ns, Some("app=chat")).is_empty()
    });
    // 30 minutes before the usual time: too early.
    evaluate(&s, &ctx, &mut memory, 180).await;
    assert_eq!(s.deployment("chat")["spec"]["replicas"], 0);
    assert!(
        !s.events_for("chat").iter().any(|(r, _)| r == "PreWarmed"),
        "{:?}",
        s.events_for("chat")
    );
    // 10 minutes before: woken.
    evaluate(&s, &ctx, &mut memory, 200).await;
    let d = s.deployment("chat");
    assert_eq!(d["spec"]["replicas"], 1, "{:?}", s.events_for("chat"));
    let annotations = d["metadata"]["annotations"].as_object().unwrap();
    assert!(annotations.contains_key("gpureaper.io/woken-at"));
    assert!(!annotations.contains_key("gpureaper.io/reaped-at"));
    let hhmm = &s.at(210)[11..16];
    let events = s.events_for("chat");
    assert!(
        events.iter().any(|(r, n)| r == "PreWarmed"
            && n.starts_with(&format!("Usually busy again at {hhmm} UTC on "))
            && n.contains("; woken 15m before: ")
            && n.ends_with(&format!(
                "scaled {}/Deployment/chat back to 1 replicas",
                s.ns
            ))),
        "{events:?}"
    );
    let metrics = ctx.metrics.encode();
    assert!(
        metrics.contains("gpu_reaper_actions_total{action=\"PreWarm\",result=\"done\"} 1"),
        "{metrics}"
    );
}
