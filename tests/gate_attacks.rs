//! Attacks on the budget gate: each test is a way a team member with ordinary namespace
//! `edit` rights (and the attestation editor role) got a large GPU claim past the gate,
//! tried against the pure decision and the webhook's HTTP handler (`Router::oneshot`, no
//! network). Each failed on 31d27a2 and must keep failing to get through. The attacks
//! whose path goes through the API server itself (the scale subresource routed by the
//! chart, HPA, the ResourceQuota while the webhook is down) are also run on the real
//! control plane by tests/budget_gate.rs.
//!
//! The attacks on who approves (four eyes by one person acting as a ServiceAccount; an
//! approval that followed the name to a re-created object) run on the real control plane
//! (`live_` tests): the real API server does the impersonation and the delete-and-create,
//! and calls the real webhook behind the chart's Service; the people are the testenv's
//! users `alice` (namespace `edit`) and `platform-oncall` (the chart's approver role).
//! GPUs reached without asking for them (a device variable, a device hostPath) are
//! attacked on the real control plane too, as an ordinary `edit` user through the chart's
//! own webhook configuration.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use gpu_reaper::admission::metrics::Metrics;
use gpu_reaper::admission::review::AdmissionRequest;
use gpu_reaper::admission::server::{AppState, SnapshotCell, probe_router, router};
use gpu_reaper::admission::{Decision, Reason, Scalable, Settings, Snapshot, Verdict, admit};
use gpu_reaper::api::{GpuPolicy, ReadinessAttestation};
use gpu_reaper::gpus::{self, Counted, GpuResources};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const NOW: &str = "2026-11-10T12:00:00Z";
const FUTURE: &str = "2030-01-01T00:00:00Z";
const NS: &str = "team-a";

fn now() -> jiff::Timestamp {
    NOW.parse().unwrap()
}

fn policy_with(spec: Value) -> Arc<GpuPolicy> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "GpuPolicy",
            "metadata": {"name": "research"},
            "spec": spec,
        }))
        .unwrap(),
    )
}

/// Enforce, 8 GPUs without an attestation.
fn enforce() -> Arc<GpuPolicy> {
    policy_with(json!({"admission": {"largeClaimGpus": 8, "mode": "Enforce"}}))
}

/// Approved for its current generation, selecting `app=llama` in team-a.
fn attestation(name: &str, max_gpus: u32) -> Arc<ReadinessAttestation> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "ReadinessAttestation",
            "metadata": {"name": name, "namespace": NS, "generation": 1},
            "spec": {
                "selector": {"matchLabels": {"app": "llama"}},
                "maxGpus": max_gpus,
                "expiresAt": FUTURE,
                "evidence": {"dataThroughputGBps": 1000.0},
            },
            "status": {
                "conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
                                "message": "ok", "lastTransitionTime": "2026-11-01T00:00:00Z"}],
                "approvedBy": "platform-oncall",
                "approvedGeneration": 1,
            },
        }))
        .unwrap(),
    )
}

fn snapshot(
    policies: Vec<Arc<GpuPolicy>>,
    attestations: Vec<Arc<ReadinessAttestation>>,
) -> Snapshot {
    Snapshot::build(
        policies,
        attestations,
        [(NS.to_string(), BTreeMap::new())],
        Default::default(),
    )
}

fn gpu_pod_spec(gpus: u32) -> Value {
    json!({"containers": [{"name": "main", "image": "trainer",
        "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]})
}

fn template(labels: Value, gpus: u32) -> Value {
    json!({"metadata": {"labels": labels}, "spec": gpu_pod_spec(gpus)})
}

fn request(operation: &str, object: Value, old: Option<Value>, user: &str) -> AdmissionRequest {
    let api_version = object["apiVersion"].as_str().unwrap_or("v1");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    serde_json::from_value(json!({
        "uid": "attack",
        "kind": {"group": group, "version": version, "kind": object["kind"]},
        "name": object["metadata"]["name"],
        "namespace": NS,
        "operation": operation,
        "userInfo": {"username": user},
        "object": object,
        "oldObject": old,
    }))
    .unwrap()
}

fn create(object: Value) -> AdmissionRequest {
    request("CREATE", object, None, "alice")
}

fn decide(snapshot: &Snapshot, request: &AdmissionRequest) -> Decision {
    admit(request, snapshot, &Settings::default(), now())
}

fn job(name: &str, labels: Value, parallelism: u32, gpus: u32) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"parallelism": parallelism, "template": template(labels, gpus)}})
}

fn assert_denied(d: &Decision, reason: Reason, says: &str) {
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    assert_eq!(d.reason, reason, "{d:?}");
    let message = d.message.as_deref().unwrap_or_default();
    assert!(message.contains(says), "{message}");
}

// --- scale paths ---------------------------------------------------------------------

/// `kubectl scale deployment/llama --replicas=N` as the API server reviews it.
fn scale(name: &str, from: u64, to: u64) -> AdmissionRequest {
    let scale = |replicas: u64| {
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas}, "status": {"replicas": from}})
    };
    serde_json::from_value(json!({
        "uid": "scale",
        "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "subResource": "scale",
        "requestKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "name": name,
        "namespace": NS,
        "operation": "UPDATE",
        "userInfo": {"username": "alice"},
        "object": scale(to),
        "oldObject": scale(from),
    }))
    .unwrap()
}

fn with_deployment(mut s: Snapshot, name: &str, per_replica: f64) -> Snapshot {
    s.add_scalable(
        ("apps".into(), "deployments".into(), NS.into(), name.into()),
        Scalable {
            per_replica,
            label_sets: vec![BTreeMap::from([("app".to_string(), name.to_string())])],
        },
    );
    s
}

#[test]
fn kubectl_scale_of_an_8_gpu_deployment_to_100_replicas_is_refused() {
    let mut s = with_deployment(snapshot(vec![enforce()], vec![]), "llama", 8.0);
    // Its one replica runs: the namespace holds 8 GPUs.
    s.add_held(NS, BTreeMap::from([("app".into(), "llama".into())]), 8.0);
    let d = decide(&s, &scale("llama", 1, 100));
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    assert_eq!(d.gpus, Some(800.0));
    // Scaling down, or to what it already holds, stays possible.
    assert!(decide(&s, &scale("llama", 100, 1)).allowed());
    // A deployment without GPUs scales freely.
    let s = with_deployment(s, "web", 0.0);
    assert!(decide(&s, &scale("web", 1, 100)).allowed());
}

#[test]
fn scaling_a_parent_the_gate_has_not_seen_is_refused_above_the_allowance() {
    let s = snapshot(vec![enforce()], vec![]);
    let d = decide(&s, &scale("unknown", 1, 100));
    assert_denied(
        &d,
        Reason::OpenEnded,
        "has not seen deployments team-a/unknown",
    );
}

// --- kinds that were not counted -------------------------------------------------------

#[test]
fn a_daemonset_asking_for_gpus_counts_one_pod_per_gpu_node() {
    let ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "miner", "namespace": NS},
        "spec": {"template": template(json!({"app": "miner"}), 8)}});
    let mut s = snapshot(vec![enforce()], vec![]);
    // Not knowing the nodes, the gate fails closed.
    let d = decide(&s, &create(ds.clone()));
    assert_denied(
        &d,
        Reason::OpenEnded,
        "DaemonSet team-a/miner claims at least 8 GPUs",
    );
    s.gpu_nodes = Some(16);
    let d = decide(&s, &create(ds));
    assert_eq!(d.gpus, Some(128.0));
    assert_eq!(d.verdict, Verdict::Deny);
}

#[test]
fn a_replication_controller_of_100_replicas_of_8_gpus_is_refused() {
    let rc = json!({"apiVersion": "v1", "kind": "ReplicationController",
        "metadata": {"name": "old-school", "namespace": NS},
        "spec": {"replicas": 100, "template": template(json!({"app": "x"}), 8)}});
    let d = decide(&snapshot(vec![enforce()], vec![]), &create(rc));
    assert_eq!(d.gpus, Some(800.0));
    assert_denied(&d, Reason::NoAttestation, "claims 800 GPUs");
}

#[test]
fn a_cronjob_whose_runs_may_overlap_is_not_one_run() {
    let cron = |policy: &str| {
        json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "every-minute", "namespace": NS},
            "spec": {"schedule": "* * * * *", "concurrencyPolicy": policy,
                     "jobTemplate": {"spec": {"template": template(json!({"app": "c"}), 8)}}}})
    };
    let s = snapshot(vec![enforce()], vec![]);
    let d = decide(&s, &create(cron("Allow")));
    assert_denied(&d, Reason::OpenEnded, "set it to Forbid or Replace");
    // One run at a time is one run.
    assert!(decide(&s, &create(cron("Forbid"))).allowed());
}

#[test]
fn a_kind_the_gate_cannot_count_is_refused_naming_the_kind() {
    let workflow = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "wf", "namespace": NS},
        "spec": {"templates": [{"name": "train", "container": {"image": "t",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}}]}});
    let d = decide(&snapshot(vec![enforce()], vec![]), &create(workflow));
    assert_denied(
        &d,
        Reason::OpenEnded,
        "cannot count the pods a Workflow (argoproj.io) runs",
    );
}

// --- nothing added up ------------------------------------------------------------------

#[test]
fn ten_8_gpu_jobs_are_refused_after_the_first() {
    let mut s = snapshot(vec![enforce()], vec![]);
    assert!(decide(&s, &create(job("j0", json!({}), 1, 8))).allowed());
    // The first one's pods run.
    s.add_held(NS, BTreeMap::new(), 8.0);
    let d = decide(&s, &create(job("j1", json!({}), 1, 8)));
    assert_denied(&d, Reason::OverAllowance, "already holds 8 GPUs");
}

#[test]
fn one_64_gpu_attestation_is_one_budget_for_every_workload_it_selects() {
    let mut s = snapshot(vec![enforce()], vec![attestation("llama", 64)]);
    let llama = json!({"app": "llama"});
    assert!(decide(&s, &create(job("a", llama.clone(), 8, 8))).allowed());
    s.add_held(NS, BTreeMap::from([("app".into(), "llama".into())]), 64.0);
    let d = decide(&s, &create(job("b", llama, 8, 8)));
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    assert!(
        d.message.as_deref().unwrap().contains("already hold"),
        "{:?}",
        d.message
    );
}

#[test]
fn a_pod_naming_ten_8_gpu_resource_claims_counts_80_gpus() {
    let mut s = snapshot(vec![enforce()], vec![]);
    let mut claims = Vec::new();
    for i in 0..10 {
        s.claims.insert((NS.into(), format!("gpu-{i}")), 8.0);
        claims.push(json!({"name": format!("c{i}"), "resourceClaimName": format!("gpu-{i}")}));
    }
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hoarder", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "x"}], "resourceClaims": claims}});
    let d = decide(&s, &create(pod));
    assert_eq!(d.gpus, Some(80.0));
    assert_eq!(d.verdict, Verdict::Deny);
}

#[test]
fn a_namespace_over_what_it_may_hold_still_gets_writes_that_add_no_gpus() {
    let mut s = snapshot(vec![enforce()], vec![]);
    // An attestation expired: the namespace holds 64 GPUs, more than its 8.
    s.add_held(NS, BTreeMap::new(), 64.0);
    let web = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "c"}]}}}});
    assert!(decide(&s, &create(web)).allowed());
    assert_eq!(
        decide(&s, &create(job("more", json!({}), 1, 1))).verdict,
        Verdict::Deny
    );
}

#[test]
fn resource_claims_count_against_the_namespace_total() {
    let claim = |name: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]}}})
    };
    let mut s = snapshot(vec![enforce()], vec![]);
    assert!(decide(&s, &create(claim("first"))).allowed());
    s.add_held(NS, BTreeMap::new(), 8.0);
    assert_denied(
        &decide(&s, &create(claim("second"))),
        Reason::OverAllowance,
        "already holds 8 GPUs",
    );
}

#[test]
fn with_1_usd_left_a_4096_gpu_job_is_refused_even_when_attested() {
    let mut p = (*policy_with(json!({"admission": {
        "largeClaimGpus": 8, "mode": "Enforce", "monthlyBudgetUsd": 50000.0}})))
    .clone();
    p.status = Some(
        serde_json::from_value(json!({
            "namespaceSpend": [{"namespace": NS, "month": "2026-11", "spentUsd": 49999.0}]
        }))
        .unwrap(),
    );
    let s = snapshot(vec![Arc::new(p)], vec![attestation("llama", 100_000)]);
    let d = decide(&s, &create(job("huge", json!({"app": "llama"}), 512, 8)));
    assert_denied(&d, Reason::OverBudget, "leaving 1 USD");
    // A 1-GPU claim does not fit either: over budget, no new GPUs.
    let d = decide(&s, &create(job("tiny", json!({}), 1, 1)));
    assert_eq!(d.reason, Reason::OverBudget);
}

#[test]
fn two_claims_back_to_back_never_add_up_past_the_months_budget() {
    // 2 USD a GPU-hour, 20.5 days left in November (492 h): 984 USD a GPU to the month's
    // end. 8,000 USD pays for 8 GPUs; one 8-GPU claim would fit, and so would the first of
    // two 4-GPU claims, but not the second once the first holds its GPUs.
    let p = policy_with(json!({"cost": {"defaultHourlyUsd": 2.0},
        "admission": {"largeClaimGpus": 16, "mode": "Enforce", "monthlyBudgetUsd": 6000.0}}));
    let mut s = snapshot(vec![p], vec![]);
    let first = decide(&s, &create(job("first", json!({}), 1, 4)));
    assert!(first.allowed(), "{first:?}");
    s.add_held(NS, BTreeMap::new(), 4.0);
    let d = decide(&s, &create(job("second", json!({}), 1, 4)));
    assert_denied(
        &d,
        Reason::OverBudget,
        "and the 4 GPUs it holds now will cost about 3,936 USD more by then, leaving 2,064 USD",
    );
    // The same Job made by the CronJob controller (a run) is held to the same total.
    let mut run = job("nightly-29000000", json!({}), 1, 4);
    run["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u", "controller": true}]);
    let d = decide(
        &s,
        &request(
            "CREATE",
            run,
            None,
            "system:serviceaccount:kube-system:cronjob-controller",
        ),
    );
    assert_denied(
        &d,
        Reason::OverBudget,
        "Job team-a/nightly-29000000 claims 4 GPUs",
    );
}

#[test]
fn a_cronjobs_runs_and_a_resumed_deployments_replicas_must_fit_the_namespace_total() {
    // Two 8-GPU CronJobs were each admitted against what was held then (nothing); when the
    // second one runs while the first's Job holds 8, its Job is refused, naming the
    // CronJob, instead of a trickle of pods the quota refuses.
    let mut s = snapshot(vec![enforce()], vec![]);
    s.add_held(NS, BTreeMap::new(), 8.0);
    let mut run = job("b-29000000", json!({}), 1, 8);
    run["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "b", "uid": "u", "controller": true}]);
    let d = decide(
        &s,
        &request(
            "CREATE",
            run.clone(),
            None,
            "system:serviceaccount:kube-system:cronjob-controller",
        ),
    );
    assert_denied(
        &d,
        Reason::OverAllowance,
        "Job team-a/b-29000000, which CronJob b creates, claims 8 GPUs, but namespace team-a already holds 8 GPUs and may hold 8",
    );
    // The ReplicaSet a paused Deployment rolls out when it is resumed: the same.
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "serve-6d4b9", "namespace": NS, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "serve", "uid": "u", "controller": true}]},
        "spec": {"replicas": 2, "template": template(json!({"app": "serve"}), 4)}});
    let d = decide(
        &s,
        &request(
            "CREATE",
            rs.clone(),
            None,
            "system:serviceaccount:kube-system:deployment-controller",
        ),
    );
    assert_denied(&d, Reason::OverAllowance, "which Deployment serve creates");
    // With room, both go in, and an update that adds nothing is never refused.
    let free = snapshot(vec![enforce()], vec![]);
    let by = |o: &Value, user: &str| decide(&free, &request("CREATE", o.clone(), None, user));
    assert!(by(&run, "system:serviceaccount:kube-system:cronjob-controller").allowed());
    assert!(
        by(
            &rs,
            "system:serviceaccount:kube-system:deployment-controller"
        )
        .allowed()
    );
    let d = decide(
        &s,
        &request(
            "UPDATE",
            rs.clone(),
            Some(rs),
            "system:serviceaccount:kube-system:deployment-controller",
        ),
    );
    assert_eq!(d.reason, Reason::OwnedByController, "{d:?}");
}

#[test]
fn resuming_a_suspended_job_claims_its_gpus_again() {
    let mut suspended = job("train", json!({}), 2, 8);
    suspended["spec"]["suspend"] = json!(true);
    let mut resumed = suspended.clone();
    resumed["spec"]["suspend"] = json!(false);
    let mut s = snapshot(vec![enforce()], vec![]);
    // Another workload holds the namespace's 8 GPUs; the suspended Job holds none.
    s.add_held(NS, BTreeMap::new(), 8.0);
    let d = decide(
        &s,
        &request("UPDATE", resumed.clone(), Some(suspended.clone()), "alice"),
    );
    assert_denied(&d, Reason::NoAttestation, "Job team-a/train claims 16 GPUs");
    // Kubeflow's runPolicy.suspend is the same.
    let mut pj = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "pt", "namespace": NS},
        "spec": {"runPolicy": {"suspend": true}, "pytorchReplicaSpecs": {
            "Worker": {"replicas": 1, "template": template(json!({}), 4)}}}});
    let old = pj.clone();
    pj["spec"]["runPolicy"]["suspend"] = json!(false);
    let d = decide(&s, &request("UPDATE", pj, Some(old), "alice"));
    assert_denied(&d, Reason::OverAllowance, "already holds 8 GPUs");
    // Suspending, or editing a label of a running Job, adds nothing.
    let d = decide(
        &s,
        &request("UPDATE", suspended.clone(), Some(resumed), "alice"),
    );
    assert_eq!(d.reason, Reason::NotIncreased, "{d:?}");
}

#[test]
fn resuming_a_deployment_created_paused_claims_its_gpus_at_kubectl_rollout_resume() {
    let deployment = |paused: bool| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "serve", "namespace": NS},
            "spec": {"paused": paused, "replicas": 2, "selector": {"matchLabels": {"app": "serve"}},
                "template": template(json!({"app": "serve"}), 8)}})
    };
    let mut s = snapshot(vec![enforce()], vec![]);
    s.add_held(NS, BTreeMap::new(), 8.0);
    let resume = request("UPDATE", deployment(false), Some(deployment(true)), "alice");
    // Created paused, never rolled out: it holds nothing, and resuming it claims 16 GPUs.
    assert_denied(
        &decide(&s, &resume),
        Reason::NoAttestation,
        "Deployment team-a/serve claims 16 GPUs",
    );
    // Paused after it rolled out (its ReplicaSet is cached): its pods are held already,
    // and a resume that changes nothing else adds nothing.
    s.add_scalable(
        (
            "apps".into(),
            "replicasets".into(),
            NS.into(),
            "serve-6d4b9".into(),
        ),
        Scalable {
            per_replica: 8.0,
            label_sets: vec![],
        },
    );
    assert_eq!(decide(&s, &resume).reason, Reason::NotIncreased);
}

#[test]
fn a_pods_kai_gpu_share_cannot_be_edited_away_after_admission() {
    let pod = |annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "frac", "namespace": NS, "annotations": annotations},
            "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c", "image": "x"}]}})
    };
    let s = snapshot(vec![enforce()], vec![]);
    let admitted = pod(json!({"gpu-fraction": "0.5"}));
    for edited in [
        pod(json!({})),
        pod(json!({"gpu-fraction": "0.1"})),
        pod(json!({"gpu-fraction": "0.5", "gpu-memory": "1"})),
    ] {
        let d = decide(
            &s,
            &request("UPDATE", edited, Some(admitted.clone()), "alice"),
        );
        assert_denied(
            &d,
            Reason::ShareChanged,
            "Pod team-a/frac may not change its \"gpu-",
        );
    }
    // A label edit keeps the share: admitted.
    let mut labelled = admitted.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    assert!(decide(&s, &request("UPDATE", labelled, Some(admitted), "alice")).allowed());
}

// --- the team picks the policy ---------------------------------------------------------

#[test]
fn labels_and_kinds_the_team_writes_do_not_pick_the_gate() {
    // The gate's policy lists kinds; a higher-priority reaper policy without admission
    // rules selects a label the team can set.
    let gate = policy_with(json!({
        "match": {"kinds": ["Job"]},
        "admission": {"largeClaimGpus": 8, "mode": "Enforce"}}));
    let mut escape = (*policy_with(json!({
        "priority": 100,
        "match": {"workloadSelector": {"matchLabels": {"gate": "off"}}}})))
    .clone();
    escape.metadata.name = Some("escape".into());
    let s = snapshot(vec![gate, Arc::new(escape)], vec![]);
    let labelled = job("labelled", json!({"gate": "off"}), 2, 8);
    assert_eq!(decide(&s, &create(labelled)).verdict, Verdict::Deny);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "other-kind", "namespace": NS},
        "spec": {"replicas": 2, "template": template(json!({}), 8)}});
    assert_eq!(decide(&s, &create(deployment)).verdict, Verdict::Deny);
}

#[test]
fn only_listed_controllers_may_create_owned_pods_unchecked() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": NS, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
        "spec": gpu_pod_spec(64)});
    // An approved 64-GPU attestation (for other labels) leaves the namespace room.
    let s = snapshot(vec![enforce()], vec![attestation("room", 64)]);
    // Any ServiceAccount of another namespace (an operator the team can drive, a token a
    // team holds elsewhere) is a `system:` identity, not a listed controller.
    for user in [
        "system:serviceaccount:tools:deployer",
        "system:node:worker-1",
        "system:admin",
    ] {
        let d = decide(&s, &request("CREATE", pod.clone(), None, user));
        assert_eq!(d.verdict, Verdict::Deny, "{user}: {d:?}");
    }
    let d = decide(
        &s,
        &request(
            "CREATE",
            pod,
            None,
            "system:serviceaccount:kube-system:replicaset-controller",
        ),
    );
    assert_eq!(d.reason, Reason::OwnedByController);
    assert!(d.allowed());
}

// --- the chart counted less than the binary -------------------------------------------

fn pod_with(resource: &str, quantity: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {resource: quantity}}}]}})
}

fn gpus_of(object: &Value) -> f64 {
    match gpus::count(object, NS, &GpuResources::default(), &()).unwrap() {
        Counted::Claim(c) => c.gpus,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_vendors_gpus_and_shares_are_counted() {
    for (resource, quantity, gpus) in [
        ("amd.com/gpu", "128", 128.0),
        ("nvidia.com/gpu.shared", "16", 16.0),
        ("gpu.intel.com/xe", "16", 16.0),
        ("habana.ai/gaudi", "16", 16.0),
        ("aws.amazon.com/neuron", "16", 16.0),
        ("google.com/tpu", "16", 16.0),
        ("nvidia.com/mig-7g.80gb", "64", 64.0),
    ] {
        assert_eq!(gpus_of(&pod_with(resource, quantity)), gpus, "{resource}");
    }
    // Intel's shares of a device are not devices.
    assert_eq!(gpus_of(&pod_with("gpu.intel.com/millicores", "500")), 0.0);
    // KAI's gpu-fraction is a fraction of a GPU per pod.
    let mut kai = pod_with("cpu", "1");
    kai["metadata"]["annotations"] = json!({"gpu-fraction": "0.5"});
    assert_eq!(gpus_of(&kai), 0.5);
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "namespace": NS},
        "spec": {"replicas": 40, "template": {"metadata": {"annotations": {"gpu-fraction": "0.5"}},
            "spec": {"containers": [{"name": "c"}]}}}});
    assert_eq!(gpus_of(&deployment), 20.0);
}

#[test]
fn the_chart_counts_the_same_gpu_resources_as_the_binary() {
    let values = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/helm/gpu-reaper/values.yaml"
    ))
    .unwrap();
    let values: Value = serde_yaml::from_str(&values).unwrap();
    let chart: Vec<&str> = values["gpu"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(chart, gpus::DEFAULT_GPU_RESOURCES.to_vec());
    let classes: Vec<&str> = values["gpu"]["deviceClasses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(classes, gpus::DEFAULT_GPU_DEVICE_CLASSES.to_vec());
}

// --- inputs that failed open -----------------------------------------------------------

#[test]
fn the_crds_bound_every_integer_the_gate_reads() {
    let crds =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crds/gpu-reaper.yaml"))
            .unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&crds)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let schema = |kind: &str| {
        docs.iter()
            .find(|d| d["spec"]["names"]["kind"] == kind)
            .unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            .clone()
    };
    let attestation = schema("ReadinessAttestation");
    let max_gpus = &attestation["properties"]["spec"]["properties"]["maxGpus"];
    assert!(max_gpus["maximum"].as_f64().is_some(), "{max_gpus}");
    let policy = schema("GpuPolicy");
    let admission = &policy["properties"]["spec"]["properties"]["admission"]["properties"];
    for field in ["largeClaimGpus", "unattestedGpus"] {
        assert!(
            admission[field]["maximum"].as_f64().is_some(),
            "{field}: {}",
            admission[field]
        );
    }
}

fn app(snapshot: Snapshot) -> axum::Router {
    router(AppState {
        snapshot: Arc::new(SnapshotCell::ready(snapshot)),
        settings: Arc::new(Settings::default()),
        metrics: Arc::new(Metrics::new()),
    })
}

async fn post(app: &axum::Router, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    let request = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

fn review(request: &AdmissionRequest) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
    .unwrap()
}

#[tokio::test]
async fn an_update_padded_to_1_3_mb_that_raises_the_gpus_is_denied_not_answered_413() {
    // A Job padded with a 1.3 MB annotation (legal in etcd): the review carries it twice.
    let padding = "x".repeat(1_300_000);
    let mut old = job("padded", json!({}), 1, 8);
    old["metadata"]["annotations"] = json!({"padding": padding});
    let mut new = old.clone();
    new["spec"]["parallelism"] = json!(100);
    let body = review(&request("UPDATE", new, Some(old), "alice"));
    assert!(body.len() > 2 << 20, "{} bytes", body.len());
    let (status, body) = post(&app(snapshot(vec![enforce()], vec![])), "/validate", body).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&body[..200.min(body.len())])
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["allowed"], false, "{v}");
}

/// What the API server sends, as text: `request` with `uid` first, `object` inline.
fn raw_review(uid: &str, object: &str) -> Vec<u8> {
    format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"{uid}","kind":{{"group":"ray.io","version":"v1","kind":"RayCluster"}},"resource":{{"group":"ray.io","version":"v1","resource":"rayclusters"}},"namespace":"team-a","operation":"CREATE","userInfo":{{"username":"alice"}},"object":{object}}}}}"#
    )
    .into_bytes()
}

/// The answer the API server reads: (uid, allowed, message).
fn answer(status: StatusCode, body: &[u8]) -> (String, bool, String) {
    assert_eq!(
        status,
        StatusCode::OK,
        "an error the failurePolicy would turn into an allow: {}",
        String::from_utf8_lossy(&body[..300.min(body.len())])
    );
    let v: Value = serde_json::from_slice(body).unwrap();
    let r = &v["response"];
    (
        r["uid"].as_str().unwrap_or("").to_string(),
        r["allowed"].as_bool().unwrap(),
        r["status"]["message"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn an_object_nested_deeper_than_the_json_reader_follows_is_refused_not_answered_400() {
    // Legal for the API server (CRD fields that preserve unknown fields), deeper than
    // serde_json's 128 levels.
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let object = format!(
        r#"{{"apiVersion":"ray.io/v1","kind":"RayCluster","metadata":{{"name":"deep","namespace":"team-a"}},"spec":{{"x":{deep}}}}}"#
    );
    let app = app(snapshot(vec![enforce()], vec![]));
    for path in ["/validate", "/mutate"] {
        let (status, body) = post(&app, path, raw_review("deep-1", &object)).await;
        let (uid, allowed, message) = answer(status, &body);
        assert_eq!(uid, "deep-1", "{path}");
        assert!(!allowed, "{path}: {message}");
        assert!(
            message.contains("nests deeper than the 127 levels"),
            "{path}: {message}"
        );
    }
}

#[tokio::test]
async fn a_review_the_api_server_made_larger_than_the_reader_reads_is_refused_not_answered_413() {
    // 2.5 MB of `<` in an annotation: within the API server's 3 MiB, and escaped as
    // \u003c on the way to the webhook, six bytes each: a 15 MB review.
    let escaped = "\\u003c".repeat(2_500_000);
    let object = format!(
        r#"{{"apiVersion":"ray.io/v1","kind":"RayCluster","metadata":{{"name":"big","namespace":"team-a","annotations":{{"a":"{escaped}"}}}},"spec":{{}}}}"#
    );
    let body = raw_review("big-1", &object);
    assert!(body.len() > 8 << 20, "{} bytes", body.len());
    let (status, body) = post(&app(snapshot(vec![enforce()], vec![])), "/validate", body).await;
    let (uid, allowed, message) = answer(status, &body);
    assert_eq!(uid, "big-1");
    assert!(!allowed, "{message}");
    assert!(message.contains("larger than the 8 MiB"), "{message}");
}

#[tokio::test]
async fn a_review_with_a_field_of_the_wrong_type_is_refused_and_one_without_a_uid_is_a_400() {
    let app = app(snapshot(vec![enforce()], vec![]));
    let body = br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"typed-1","operation":7}}"#;
    let (status, body) = post(&app, "/validate", body.to_vec()).await;
    let (uid, allowed, _) = answer(status, &body);
    assert_eq!((uid.as_str(), allowed), ("typed-1", false));
    // Nothing to answer to: only an error is possible (the API server never sends this).
    let (status, _) = post(&app, "/validate", b"{\"request\":{}}".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn validate_is_not_served_on_the_plain_http_probe_port() {
    let probes = probe_router(AppState {
        snapshot: Arc::new(SnapshotCell::ready(snapshot(vec![enforce()], vec![]))),
        settings: Arc::new(Settings::default()),
        metrics: Arc::new(Metrics::new()),
    });
    let body = review(&create(job("j", json!({}), 1, 1)));
    let (status, _) = post(&probes, "/validate", body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let request = Request::builder()
        .uri("/readyz")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        probes.oneshot(request).await.unwrap().status(),
        StatusCode::OK
    );
}

#[test]
fn a_1_6_mb_pytorchjob_of_thousands_of_roles_is_counted_with_every_label_set_once() {
    // Thousands of replica roles, each with its own labels and a GPU: the count must stay
    // linear (the quadratic de-duplication took 16 s, past the webhook's 3 s timeout:
    // failurePolicy Ignore admitted it). benches/admission.rs measures the time.
    let mut roles = serde_json::Map::new();
    for i in 0..6000 {
        roles.insert(
            format!("Role{i:05}"),
            json!({"replicas": 1, "template": template(
                json!({"app": "llama", "role": format!("r{i}"), "pad": "p".repeat(150)}), 1)}),
        );
    }
    let job = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "big", "namespace": NS},
        "spec": {"pytorchReplicaSpecs": roles}});
    let size = serde_json::to_vec(&job).unwrap().len();
    assert!(size > 1_500_000, "{size} bytes");
    let Counted::Claim(c) = gpus::count(&job, NS, &GpuResources::default(), &()).unwrap() else {
        panic!()
    };
    assert_eq!(c.gpus, 6000.0);
    assert_eq!(c.label_sets.len(), 6001);
    let d = decide(&snapshot(vec![enforce()], vec![]), &create(job));
    assert_eq!(d.verdict, Verdict::Deny);
}

// --- approvals of what nobody saw ------------------------------------------------------

fn attestation_object(annotations: Value, status: Option<Value>) -> Value {
    let mut v = json!({"apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
        "metadata": {"name": "llama", "namespace": NS, "generation": 2, "annotations": annotations},
        "spec": {"selector": {"matchLabels": {"app": "llama"}}, "maxGpus": 64, "expiresAt": FUTURE}});
    if let Some(s) = status {
        v["status"] = s;
    }
    v
}

fn approval(by: &str) -> Value {
    json!({"conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
            "message": "ok", "lastTransitionTime": "2026-11-10T00:00:00Z"}],
        "approvedBy": by, "approvedGeneration": 2})
}

fn status_write(object: Value, old: Value, user: &str) -> AdmissionRequest {
    let mut r = request("UPDATE", object, Some(old), user);
    r.sub_resource = Some("status".into());
    r
}

#[test]
fn the_person_who_last_changed_the_spec_cannot_approve_it() {
    let s = snapshot(vec![enforce()], vec![]);
    let edited = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    let approved = attestation_object(
        json!({"gpureaper.io/spec-changed-by": "alice"}),
        Some(approval("alice")),
    );
    let d = decide(&s, &status_write(approved.clone(), edited.clone(), "alice"));
    assert_denied(
        &d,
        Reason::SelfApproval,
        "was last changed by alice, who may not approve it",
    );
    // Naming someone else in approvedBy does not help.
    let mut other = approved.clone();
    other["status"] = approval("bob");
    assert_eq!(
        decide(&s, &status_write(other, edited.clone(), "alice")).verdict,
        Verdict::Deny
    );
    // Another approver may.
    let mut by_bob = approved;
    by_bob["status"] = approval("bob");
    assert!(decide(&s, &status_write(by_bob, edited, "bob")).allowed());
}

#[test]
fn an_attestation_that_does_not_record_who_changed_its_spec_cannot_be_approved() {
    let s = snapshot(vec![enforce()], vec![]);
    let edited = attestation_object(json!({}), None);
    let approved = attestation_object(json!({}), Some(approval("bob")));
    let d = decide(&s, &status_write(approved, edited, "bob"));
    assert_denied(
        &d,
        Reason::AttestationInvalid,
        "does not record who last changed its spec",
    );
}

#[test]
fn a_spec_change_must_name_its_author_and_the_record_cannot_be_forged() {
    let s = snapshot(vec![enforce()], vec![]);
    let old = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    // Mallory widens the spec and leaves alice's name, so that she can approve it.
    let mut widened = old.clone();
    widened["spec"]["maxGpus"] = json!(100000);
    widened["spec"]["selector"] = json!({});
    let d = decide(
        &s,
        &request("UPDATE", widened.clone(), Some(old.clone()), "mallory"),
    );
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    // Nor can the record be edited without a spec change.
    let mut forged = old.clone();
    forged["metadata"]["annotations"] = json!({"gpureaper.io/spec-changed-by": "nobody"});
    let d = decide(&s, &request("UPDATE", forged, Some(old.clone()), "mallory"));
    assert_eq!(d.verdict, Verdict::Deny, "{d:?}");
    // Erasing the record goes in, but then nobody can approve it (see the test above).
    let mut erased = widened.clone();
    erased["metadata"]["annotations"] = json!({});
    let d = decide(&s, &request("UPDATE", erased, Some(old.clone()), "mallory"));
    assert!(d.allowed(), "{d:?}");
    assert!(d.warnings[0].contains("cannot be approved"), "{d:?}");
    // With the record the mutating webhook writes, the edit goes in.
    widened["metadata"]["annotations"] = json!({"gpureaper.io/spec-changed-by": "mallory"});
    assert!(decide(&s, &request("UPDATE", widened, Some(old), "mallory")).allowed());
}

#[test]
fn a_spec_a_service_account_last_changed_is_approved_by_nobody() {
    // alice may edit team-a, so she may act as its ServiceAccounts (`kubectl --as`); the
    // request names only the ServiceAccount, so nobody can be shown to be someone else.
    let s = snapshot(vec![enforce()], vec![]);
    let builder = "system:serviceaccount:team-a:builder";
    let edited = attestation_object(json!({"gpureaper.io/spec-changed-by": builder}), None);
    for approver in [
        "alice",
        "platform-oncall",
        "system:serviceaccount:ci:deployer",
    ] {
        let approved = attestation_object(
            json!({"gpureaper.io/spec-changed-by": builder}),
            Some(approval(approver)),
        );
        let d = decide(&s, &status_write(approved, edited.clone(), approver));
        assert_denied(
            &d,
            Reason::SelfApproval,
            &format!(
                "was last changed by ServiceAccount {builder}, which anyone who may edit namespace team-a can act as"
            ),
        );
    }
}

#[test]
fn a_service_account_is_not_a_second_pair_of_eyes() {
    // alice wrote the spec as herself and approves as a ServiceAccount with the approver
    // role, which she may impersonate.
    let s = snapshot(vec![enforce()], vec![]);
    let edited = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    let bot = "system:serviceaccount:team-a:approver-bot";
    let approved = attestation_object(
        json!({"gpureaper.io/spec-changed-by": "alice"}),
        Some(approval("approver-bot")),
    );
    let d = decide(&s, &status_write(approved, edited, bot));
    assert_denied(&d, Reason::SelfApproval, "approvals are made by people");
}

#[test]
fn an_approval_names_the_object_it_binds_to() {
    let s = snapshot(vec![enforce()], vec![]);
    let with_uid = |status: Option<Value>| {
        let mut v = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), status);
        v["metadata"]["uid"] = json!("u-2");
        v
    };
    let edited = with_uid(None);
    let approved_as = |uid: Option<&str>| {
        let mut status = approval("bob");
        if let Some(uid) = uid {
            status["approvedUid"] = json!(uid);
        }
        with_uid(Some(status))
    };
    // The approval of u-1 (deleted and created again since, as u-2).
    let d = decide(
        &s,
        &status_write(approved_as(Some("u-1")), edited.clone(), "bob"),
    );
    assert_denied(
        &d,
        Reason::AttestationInvalid,
        "status.approvedUid u-1 must equal metadata.uid u-2",
    );
    let d = decide(&s, &status_write(approved_as(None), edited.clone(), "bob"));
    assert_denied(
        &d,
        Reason::AttestationInvalid,
        "status.approvedUid (unset) must equal metadata.uid u-2",
    );
    assert!(decide(&s, &status_write(approved_as(Some("u-2")), edited, "bob")).allowed());
}

#[test]
fn an_approval_of_another_object_of_the_same_name_covers_nothing() {
    let approved_as = |uid: &str| {
        let mut a = (*attestation("llama", 64)).clone();
        a.metadata.uid = Some("u-2".into());
        a.status.as_mut().unwrap().approved_uid = Some(uid.into());
        Arc::new(a)
    };
    let claim = create(job("train", json!({"app": "llama"}), 2, 8));
    let other = approved_as("u-1");
    let d = decide(&snapshot(vec![enforce()], vec![other.clone()]), &claim);
    assert_denied(
        &d,
        Reason::StaleApproval,
        "was approved as another object of that name (uid u-1), not this one (uid u-2)",
    );
    // Nor does it count toward what the namespace may hold (G1, and the quota).
    assert!(!gpu_reaper::admission::checks::standing(&other, now()));
    let this = approved_as("u-2");
    assert!(gpu_reaper::admission::checks::standing(&this, now()));
    assert!(decide(&snapshot(vec![enforce()], vec![this.clone()]), &claim).allowed());
}

#[tokio::test]
async fn the_mutating_webhook_records_who_changed_the_spec() {
    use base64::Engine as _;
    let old = attestation_object(json!({"gpureaper.io/spec-changed-by": "alice"}), None);
    let mut new = old.clone();
    new["spec"]["maxGpus"] = json!(128);
    let r = request("UPDATE", new, Some(old), "mallory");
    let (status, body) = post(&app(snapshot(vec![], vec![])), "/mutate", review(&r)).await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(v["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/metadata/annotations/gpureaper.io~1spec-changed-by", "value": "mallory"}])
    );
}

// --- on the real control plane: who approves, and what ------------------------------

mod live {
    use std::path::PathBuf;
    use std::process::Command;

    use serde_json::{Value, json};

    use super::common::chart::{BIN, Cleanup, Gate, GatedNamespace};
    use super::common::cluster::{Cluster, Run, run_with_stdin, wait_until};

    /// One attack's stage: a namespace governed by an Enforce policy (8 GPUs without an
    /// attestation), the chart's webhook (validating and mutating) serving it, the chart's
    /// attestation roles, and two people: alice, who may `edit` the namespace (the
    /// built-in role, with its `impersonate` on the namespace's ServiceAccounts) and write
    /// attestations there; platform-oncall, an approver for the namespace.
    pub struct Stage {
        pub cluster: &'static Cluster,
        pub ns: String,
        /// The chart's attestation editor and approver ClusterRoles.
        pub editor_role: String,
        pub approver_role: String,
        pub alice: PathBuf,
        pub oncall: PathBuf,
        pub _gate: Gate,
        pub _cleanup: Cleanup,
    }

    pub fn stage(prefix: &str) -> Stage {
        let values = json!({
            "controller": {"enabled": false},
            "samplePolicy": {"enabled": false},
            "webhook": {"failurePolicy": "Fail"},
            // The shared cluster's `edit` stays as it is; alice gets the editor role by a
            // binding of her own.
            "attestationRoles": {"aggregateToEdit": false},
        });
        let g = GatedNamespace::start(prefix, &values, |policy, ns| {
            format!(
                "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {policy}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}}\n  admission: {{largeClaimGpus: 8, mode: Enforce}}\n"
            )
        });
        let GatedNamespace {
            cluster,
            ns,
            objects,
            gate,
            mut cleanup,
            ..
        } = g;
        let role = |suffix: &str| -> String {
            let role = objects
                .iter()
                .find(|o| {
                    o["kind"] == "ClusterRole"
                        && o["metadata"]["name"]
                            .as_str()
                            .is_some_and(|n| n.ends_with(suffix))
                })
                .unwrap_or_else(|| panic!("the chart renders a ClusterRole *{suffix}"));
            cluster.apply(&role.to_string());
            role["metadata"]["name"].as_str().unwrap().to_string()
        };
        let editor_role = role("-attestation-editor");
        cleanup.add("clusterrole", &editor_role);
        let approver_role = role("-attestation-approver");
        cleanup.add("clusterrole", &approver_role);
        let binding = |name: &str, role: &str, subject: Value| {
            cluster.apply(
                &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": name, "namespace": ns},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [subject]})
                .to_string(),
            );
        };
        let user = |name: &str| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name});
        binding("alice-edit", "edit", user("alice"));
        binding("alice-attestations", &editor_role, user("alice"));
        binding("oncall-approves", &approver_role, user("platform-oncall"));
        Stage {
            cluster,
            alice: cluster.dir.join("alice.kubeconfig"),
            oncall: cluster.dir.join("approver.kubeconfig"),
            ns,
            editor_role,
            approver_role,
            _gate: gate,
            _cleanup: cleanup,
        }
    }

    impl Stage {
        /// kubectl as the person of `kubeconfig`.
        pub fn kubectl(&self, kubeconfig: &PathBuf, args: &[&str], stdin: Option<&str>) -> Run {
            run_with_stdin(
                Command::new(self.cluster.bin("kubectl"))
                    .arg("--kubeconfig")
                    .arg(kubeconfig)
                    .args(args),
                stdin,
            )
        }

        /// `gpu-reaper` as the person of `kubeconfig`.
        pub fn gpu_reaper(&self, kubeconfig: &PathBuf, args: &[&str]) -> Run {
            run_with_stdin(
                Command::new(BIN).args(args).env("KUBECONFIG", kubeconfig),
                None,
            )
        }

        /// The attestation `name` as stored.
        pub fn attestation(&self, name: &str) -> Value {
            self.cluster
                .get("readinessattestation", Some(&self.ns), name)
                .expect("the attestation exists")
        }

        /// Whether the stored attestation `name` is marked approved.
        pub fn approved(&self, name: &str) -> bool {
            self.attestation(name)["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Approved" && c["status"] == "True")
        }

        /// `kubectl patch --subresource status` setting Approved=True for `generation`
        /// and `uid`, as `kubeconfig` (with `as_`: impersonating that identity).
        pub fn approve_by_hand(
            &self,
            kubeconfig: &PathBuf,
            as_: Option<&str>,
            name: &str,
            by: &str,
            generation: i64,
            uid: &str,
        ) -> Run {
            let status = json!({"status": {
                "conditions": [{"type": "Approved", "status": "True", "reason": "Approved",
                    "message": "reviewed", "lastTransitionTime": "2026-11-10T00:00:00Z"}],
                "approvedBy": by, "approvedGeneration": generation, "approvedUid": uid}})
            .to_string();
            let mut args = vec![
                "patch",
                "readinessattestation",
                name,
                "-n",
                &self.ns,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status,
            ];
            let as_flag = as_.map(|a| format!("--as={a}"));
            if let Some(a) = &as_flag {
                args.push(a);
            }
            self.kubectl(kubeconfig, &args, None)
        }

        /// A 16-GPU Job labelled `app=llama`, created by alice with a server dry run (no
        /// pods hold the shared nodes' GPUs): its outcome.
        pub fn claim_16_gpus(&self) -> Run {
            let job = json!({"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "train", "namespace": self.ns, "labels": {"app": "llama"}},
                "spec": {"parallelism": 2, "template": {
                    "metadata": {"labels": {"app": "llama"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})
            .to_string();
            self.kubectl(
                &self.alice,
                &["create", "--dry-run=server", "-f", "-"],
                Some(&job),
            )
        }

        /// Waits until alice's 16-GPU claim is refused with a sentence containing `says`
        /// (the webhook's cache follows the API server a moment later).
        pub fn claim_refused(&self, says: &str) {
            wait_until(&format!("the 16-GPU claim refused with {says:?}"), || {
                let run = self.claim_16_gpus();
                !run.ok && run.stderr.contains(says)
            });
        }

        pub fn claim_admitted(&self) {
            wait_until("the 16-GPU claim admitted", || self.claim_16_gpus().ok);
        }
    }

    pub fn attestation(ns: &str, max_gpus: u32, selector: Value) -> String {
        json!({"apiVersion": "gpureaper.io/v1alpha1", "kind": "ReadinessAttestation",
            "metadata": {"name": "llama", "namespace": ns},
            "spec": {"selector": selector, "maxGpus": max_gpus,
                     "expiresAt": "2099-01-01T00:00:00Z",
                     "evidence": {"dataThroughputGBps": 40, "notes": "loader benchmark"}}})
        .to_string()
    }
}

/// Issue #33 (A): namespace `edit` grants `impersonate` on the namespace's
/// ServiceAccounts. alice wrote the attestation as one (`kubectl --as
/// system:serviceaccount:<ns>:builder`), so the record named the ServiceAccount, and she
/// approved it as herself: one person, counted as two pairs of eyes.
#[test]
fn live_an_editor_acting_as_a_service_account_is_not_a_second_pair_of_eyes() {
    let s = live::stage("eyes");
    let (cluster, ns) = (s.cluster, s.ns.as_str());
    // The namespace's CI bot, allowed to edit it; and a bot someone made an approver.
    for bot in ["builder", "approver-bot"] {
        cluster.kubectl(&["create", "serviceaccount", bot, "-n", ns], None);
    }
    for (i, (bot, role)) in [
        ("builder", "edit"),
        ("builder", s.editor_role.as_str()),
        ("approver-bot", s.approver_role.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        cluster.kubectl(
            &[
                "create",
                "rolebinding",
                &format!("{bot}-{i}"),
                "-n",
                ns,
                &format!("--clusterrole={role}"),
                &format!("--serviceaccount={ns}:{bot}"),
            ],
            None,
        );
    }
    // alice leads the team: she approves for her namespace too (a RoleBinding per
    // namespace, as docs/security.md shows).
    cluster.kubectl(
        &[
            "create",
            "rolebinding",
            "alice-approves",
            "-n",
            ns,
            &format!("--clusterrole={}", s.approver_role),
            "--user=alice",
        ],
        None,
    );
    let builder = format!("system:serviceaccount:{ns}:builder");

    // alice writes the spec as the builder ServiceAccount: the record names it.
    let attestation = live::attestation(ns, 64, json!({"matchLabels": {"app": "llama"}}));
    let wrote = s.kubectl(
        &s.alice,
        &["apply", "-f", "-", &format!("--as={builder}")],
        Some(&attestation),
    );
    assert!(
        wrote.ok,
        "alice writes as the ServiceAccount: {}",
        wrote.stderr
    );
    let stored = s.attestation("llama");
    assert_eq!(
        stored["metadata"]["annotations"]["gpureaper.io/spec-changed-by"],
        builder.as_str()
    );
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_string();

    // Then she approves it as herself, by hand and with the CLI: refused both ways.
    let by_hand = s.approve_by_hand(&s.alice, None, "llama", "alice", 1, &uid);
    assert!(
        !by_hand.ok,
        "alice approved the spec she wrote as {builder}: {}",
        by_hand.stdout
    );
    assert!(
        by_hand
            .stderr
            .contains(&format!("was last changed by ServiceAccount {builder}")),
        "{}",
        by_hand.stderr
    );
    let target = format!("{ns}/llama");
    let cli = s.gpu_reaper(
        &s.alice,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &uid,
        ],
    );
    assert!(!cli.ok, "{}", cli.stdout);
    assert!(!s.approved("llama"), "{}", s.attestation("llama"));
    s.claim_refused("is not approved");

    // The other way round: alice writes the spec as herself and approves as a
    // ServiceAccount that holds the approver role.
    let mine = s.kubectl(
        &s.alice,
        &["apply", "-f", "-"],
        Some(&attestation.replace("loader benchmark", "loader benchmark, run 2")),
    );
    assert!(mine.ok, "{}", mine.stderr);
    assert_eq!(
        s.attestation("llama")["metadata"]["annotations"]["gpureaper.io/spec-changed-by"],
        "alice"
    );
    let as_bot = s.approve_by_hand(
        &s.alice,
        Some(&format!("system:serviceaccount:{ns}:approver-bot")),
        "llama",
        "approver-bot",
        2,
        &uid,
    );
    assert!(
        !as_bot.ok,
        "alice approved her own spec as a ServiceAccount"
    );
    assert!(
        as_bot.stderr.contains("approvals are made by people"),
        "{}",
        as_bot.stderr
    );
    assert!(!s.approved("llama"));

    // A second person approves what alice wrote as herself: admitted.
    let approve = s.gpu_reaper(
        &s.oncall,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "2",
            "--uid",
            &uid,
        ],
    );
    assert!(approve.ok, "{}", approve.stderr);
    assert_eq!(
        s.attestation("llama")["status"]["approvedBy"],
        "platform-oncall"
    );
    s.claim_admitted();
}

/// Issue #33 (B): between review and `attest approve --generation 1`, the attestation was
/// deleted and re-created under the same name (generation 1 again) with `maxGpus:
/// 1000000` and an empty selector, and the approval landed on the new object.
#[test]
fn live_an_approval_binds_to_the_object_reviewed_not_to_its_name() {
    let s = live::stage("uid");
    let ns = s.ns.as_str();
    let target = format!("{ns}/llama");
    let modest = live::attestation(ns, 16, json!({"matchLabels": {"app": "llama"}}));
    let wrote = s.kubectl(&s.alice, &["apply", "-f", "-"], Some(&modest));
    assert!(wrote.ok, "{}", wrote.stderr);
    // The approver reviews generation 1 of the object with this uid.
    let reviewed = s.kubectl(
        &s.oncall,
        &[
            "get",
            "readinessattestation",
            "llama",
            "-n",
            ns,
            "-o",
            "json",
        ],
        None,
    );
    assert!(reviewed.ok, "{}", reviewed.stderr);
    let reviewed: Value = serde_json::from_str(&reviewed.stdout).unwrap();
    let reviewed_uid = reviewed["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(reviewed["metadata"]["generation"], 1);

    // alice swaps it for another object of the same name, at generation 1 again.
    let deleted = s.kubectl(
        &s.alice,
        &[
            "delete",
            "readinessattestation",
            "llama",
            "-n",
            ns,
            "--wait=true",
        ],
        None,
    );
    assert!(deleted.ok, "{}", deleted.stderr);
    let greedy = live::attestation(ns, 1_000_000, json!({}));
    let swapped = s.kubectl(&s.alice, &["create", "-f", "-"], Some(&greedy));
    assert!(swapped.ok, "{}", swapped.stderr);
    let current = s.attestation("llama");
    assert_eq!(current["metadata"]["generation"], 1);
    let current_uid = current["metadata"]["uid"].as_str().unwrap().to_string();
    assert_ne!(current_uid, reviewed_uid);

    // The approval of what was reviewed does not land on the new object: neither by the
    // CLI nor by hand.
    let cli = s.gpu_reaper(
        &s.oncall,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &reviewed_uid,
        ],
    );
    assert!(!cli.ok, "{}", cli.stdout);
    let by_hand = s.approve_by_hand(
        &s.oncall,
        None,
        "llama",
        "platform-oncall",
        1,
        &reviewed_uid,
    );
    assert!(
        !by_hand.ok,
        "the approval of {reviewed_uid} landed on {current_uid}"
    );
    assert!(
        by_hand.stderr.contains(&format!(
            "status.approvedUid {reviewed_uid} must equal metadata.uid {current_uid}"
        )),
        "{}",
        by_hand.stderr
    );
    assert!(!s.approved("llama"), "{}", s.attestation("llama"));
    s.claim_refused("is not approved");

    // `attest approve` shows the object's uid with the spec, and approving what it shows
    // records that uid.
    let review = s.gpu_reaper(&s.oncall, &["attest", "approve", &target]);
    assert!(!review.ok);
    assert!(
        review
            .stderr
            .contains(&format!("--generation 1 --uid {current_uid}")),
        "{}",
        review.stderr
    );
    let approve = s.gpu_reaper(
        &s.oncall,
        &[
            "attest",
            "approve",
            &target,
            "--generation",
            "1",
            "--uid",
            &current_uid,
        ],
    );
    assert!(approve.ok, "{}", approve.stderr);
    assert_eq!(
        s.attestation("llama")["status"]["approvedUid"],
        current_uid.as_str()
    );
}

// --- GPUs reached without asking for them (issue #33, item 5) --------------------------

/// An ordinary user of `namespaces`: a ServiceAccount of the first, bound to the built-in
/// `edit` ClusterRole in each, acting with a real token.
fn edit_user(
    cluster: &common::cluster::Cluster,
    namespaces: &[&str],
    dir: &std::path::Path,
) -> std::path::PathBuf {
    cluster.kubectl(
        &["create", "serviceaccount", "dev", "-n", namespaces[0]],
        None,
    );
    for ns in namespaces {
        cluster.kubectl(
            &[
                "create",
                "rolebinding",
                "dev-edit",
                "-n",
                ns,
                "--clusterrole=edit",
                &format!("--serviceaccount={}:dev", namespaces[0]),
            ],
            None,
        );
    }
    common::chart::service_account_kubeconfig(cluster, dir, namespaces[0], "dev")
}

/// A Deployment of `replicas` pods that set NVIDIA_VISIBLE_DEVICES=all and request no GPU.
fn peeking_deployment(ns: &str, replicas: u32) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "peek", "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "peek"}},
            "template": {"metadata": {"labels": {"app": "peek"}},
                "spec": {"containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}}})
    .to_string()
}

/// With the NVIDIA container toolkit's default configuration, 12 pods that set
/// NVIDIA_VISIBLE_DEVICES=all on 8-GPU nodes reached 96 GPUs that nothing counted. In a
/// governed namespace `kubectl apply` now refuses them, and a pod mounting /dev/nvidia0,
/// with one sentence; the namespace next door, which no policy governs, and a pod that
/// asks for its GPU are not affected.
#[test]
fn gpus_reached_through_nvidia_visible_devices_or_a_device_host_path_are_refused_at_apply() {
    use common::chart::{Cleanup, Gate, render};
    use common::cluster::{cluster, unique, wait_until};

    let cluster = cluster();
    cluster.install_crds();
    let mut cleanup = Cleanup::new(cluster);
    let system = cluster.namespace("devices-sys", &[]);
    cleanup.add("namespace", &system);
    let governed = cluster.namespace("devices", &[]);
    cleanup.add("namespace", &governed);
    let free = cluster.namespace("devices-free", &[]);
    cleanup.add("namespace", &free);
    let policy = format!("research-{governed}");
    cluster.apply(&format!(
        "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {policy}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {governed}}}}}}}\n  admission: {{largeClaimGpus: 8, mode: Enforce}}\n"
    ));
    cleanup.add("gpupolicy", &policy);
    let release = format!("devices-{}", unique());
    let values = json!({"controller": {"enabled": false}, "samplePolicy": {"enabled": false},
        "webhook": {"failurePolicy": "Fail"}});
    let objects = render(cluster, &release, &system, &values, &[]).expect("helm template");
    let gate = Gate::start(cluster, &objects, &[&governed, &free], &cluster.kubeconfig);
    cleanup.add("validatingwebhookconfiguration", &gate.vwc_name);
    gate.wait_called(&governed);
    gate.wait_called(&free);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = edit_user(cluster, &[&governed, &free], dir.path());
    let dev = |args: &[&str], stdin: &str| {
        common::cluster::run_with_stdin(
            std::process::Command::new(cluster.bin("kubectl"))
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args),
            Some(stdin),
        )
    };
    // The RoleBinding reaches the authorizer's cache a moment after it is created.
    wait_until("the edit user may create deployments", || {
        dev(
            &["auth", "can-i", "create", "deployments", "-n", &governed],
            "",
        )
        .stdout
        .trim()
            == "yes"
    });

    // 12 replicas that see every GPU of their nodes, counted by nothing: refused.
    let applied = dev(&["apply", "-f", "-"], &peeking_deployment(&governed, 12));
    assert!(!applied.ok, "admitted: {}", applied.stdout);
    let sentence = format!(
        "Deployment {governed}/peek asks for GPU devices through NVIDIA_VISIBLE_DEVICES=all in container \"main\" of its pods without requesting nvidia.com/gpu: request the GPUs as resources (limits: nvidia.com/gpu: N) so they are counted, or remove the variable; cluster admins should also set accept-nvidia-visible-devices-envvar-when-unprivileged = false in the NVIDIA container toolkit (docs/security.md)."
    );
    assert!(
        applied
            .stderr
            .contains("admission webhook \"budget-gate.gpureaper.io\" denied the request")
            && applied.stderr.contains(&sentence),
        "{}",
        applied.stderr
    );
    assert!(cluster.get("deployment", Some(&governed), "peek").is_none());

    // A bare pod mounting a GPU's device node from the host: refused.
    let host_path = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "node-gpu", "namespace": governed},
        "spec": {"volumes": [{"name": "gpu", "hostPath": {"path": "/dev/nvidia0", "type": "CharDevice"}}],
            "containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                "volumeMounts": [{"name": "gpu", "mountPath": "/dev/nvidia0"}]}]}})
    .to_string();
    let applied = dev(&["apply", "-f", "-"], &host_path);
    assert!(!applied.ok, "admitted: {}", applied.stdout);
    assert!(
        applied.stderr.contains(&format!(
            "Pod {governed}/node-gpu asks for GPU devices through hostPath volume \"gpu\" (/dev/nvidia0) in container \"main\" without requesting nvidia.com/gpu: request the GPUs as resources (limits: nvidia.com/gpu: N) so they are counted, or remove the volume"
        )),
        "{}",
        applied.stderr
    );
    assert!(cluster.get("pod", Some(&governed), "node-gpu").is_none());

    // The variable in a bare pod's init container reaches the gate through the chart's
    // matchConditions too.
    let init = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "init-peek", "namespace": governed},
        "spec": {"initContainers": [{"name": "warmup", "image": "busybox",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1,2,3"}]}],
            "containers": [{"name": "main", "image": "busybox"}]}})
    .to_string();
    let applied = dev(&["apply", "-f", "-"], &init);
    assert!(
        !applied.ok
            && applied
                .stderr
                .contains("NVIDIA_VISIBLE_DEVICES=0,1,2,3 in init container \"warmup\""),
        "{} {}",
        applied.stdout,
        applied.stderr
    );

    // A pod that asks for its GPU is counted and admitted, as before.
    let counted = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "counted", "namespace": governed},
        "spec": {"containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    .to_string();
    let applied = dev(&["apply", "-f", "-"], &counted);
    assert!(applied.ok, "{}", applied.stderr);

    // A namespace no admission policy governs is not affected.
    let applied = dev(&["apply", "-f", "-"], &peeking_deployment(&free, 1));
    assert!(applied.ok, "{}", applied.stderr);
    assert!(
        applied.stderr.is_empty(),
        "no warning either: {}",
        applied.stderr
    );
    cluster.kubectl(
        &["delete", "deployment", "peek", "-n", &free, "--wait=false"],
        None,
    );
    cluster.kubectl(
        &["delete", "pod", "counted", "-n", &governed, "--wait=false"],
        None,
    );
}

// --- the namespace's total where pieces meet, on the live cluster ----------------------

/// The chart's gate (its default failure policies) on the real control plane, governing
/// one namespace under `admission` rules, and an ordinary `edit` user of it.
struct LiveGate {
    cluster: &'static common::cluster::Cluster,
    ns: String,
    gate: common::chart::Gate,
    kubeconfig: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _cleanup: common::chart::Cleanup,
}

impl LiveGate {
    fn start(prefix: &str, policy_spec: &str) -> Self {
        // The chart's own failure policies: workloads Ignore, GPU pods and claims Fail.
        let values = json!({"controller": {"enabled": false}, "samplePolicy": {"enabled": false}});
        let g = common::chart::GatedNamespace::start(prefix, &values, |policy, ns| {
            format!(
                "apiVersion: gpureaper.io/v1alpha1\nkind: GpuPolicy\nmetadata: {{name: {policy}}}\nspec:\n  match: {{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}}}\n{policy_spec}"
            )
        });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = edit_user(g.cluster, &[&g.ns], dir.path());
        let live = LiveGate {
            cluster: g.cluster,
            ns: g.ns,
            gate: g.gate,
            kubeconfig,
            _dir: dir,
            _cleanup: g.cleanup,
        };
        common::cluster::wait_until("the edit user may create deployments", || {
            live.dev(
                &["auth", "can-i", "create", "deployments", "-n", &live.ns],
                "",
            )
            .stdout
            .trim()
                == "yes"
        });
        live
    }

    /// kubectl as the `edit` user.
    fn dev(&self, args: &[&str], stdin: &str) -> common::cluster::Run {
        common::cluster::run_with_stdin(
            std::process::Command::new(self.cluster.bin("kubectl"))
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args),
            Some(stdin),
        )
    }

    fn apply(&self, manifest: &str) -> common::cluster::Run {
        self.dev(&["apply", "-f", "-"], manifest)
    }

    /// Waits until the gate's caches hold what the namespace runs: a server-side dry run
    /// of `manifest` is refused.
    fn wait_refused(&self, what: &str, manifest: &str) {
        common::cluster::wait_until(what, || {
            !self
                .dev(&["apply", "--dry-run=server", "-f", "-"], manifest)
                .ok
        });
    }

    fn pods(&self, selector: &str) -> usize {
        self.cluster
            .list("pods", &self.ns, Some(selector))
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count()
    }

    /// Waits (up to `patience`) for an Event in the namespace whose message contains every
    /// one of `says`.
    fn wait_event(&self, what: &str, says: &[&str], patience: std::time::Duration) -> String {
        let deadline = std::time::Instant::now() + patience;
        loop {
            let events = self.cluster.list("events", &self.ns, None);
            if let Some(found) = events
                .iter()
                .filter_map(|e| e["message"].as_str())
                .find(|m| says.iter().all(|s| m.contains(s)))
            {
                return found.to_string();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; the namespace's events: {events:#?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
}

/// A Deployment of `replicas` pods, each with `quantity` of `resource`.
fn live_deployment(ns: &str, name: &str, resource: &str, quantity: &str) -> String {
    let limits = if resource.is_empty() {
        json!({})
    } else {
        json!({resource: quantity})
    };
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai:v0.6.3",
                    "resources": {"limits": limits}}]}}}})
    .to_string()
}

/// A ResourceQuota bounds each GPU resource on its own, so with the webhook down one
/// namespace held 8 AMD + 8 NVIDIA GPUs + MIG slices worth 4 against an allowance of 8.
/// With the gate up the sum is refused at `kubectl apply`; with the gate down (the
/// webhook process stopped, its configuration registered, the chart's default failure
/// policies) workloads still go in but no GPU pod is created, and pods without GPUs are
/// not held up.
#[test]
fn live_gpu_resources_add_up_to_one_total_and_with_the_gate_down_no_gpu_pod_starts() {
    let mut g = LiveGate::start("sum", "  admission: {largeClaimGpus: 8, mode: Enforce}\n");
    let ns = g.ns.clone();
    let amd = live_deployment(&ns, "amd", "amd.com/gpu", "8");
    let applied = g.apply(&amd);
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the AMD pod", || g.pods("app=amd") == 1);
    let nvidia = live_deployment(&ns, "nvidia", "nvidia.com/gpu", "8");
    g.wait_refused("the gate counts the AMD pod", &nvidia);
    for (name, manifest, gpus) in [
        ("nvidia", nvidia.clone(), "8"),
        (
            "mig",
            live_deployment(&ns, "mig", "nvidia.com/mig-1g.10gb", "28"),
            "4",
        ),
    ] {
        let applied = g.apply(&manifest);
        assert!(!applied.ok, "{name} admitted: {}", applied.stdout);
        assert!(
            applied.stderr.contains(&format!(
                "Deployment {ns}/{name} claims {gpus} GPUs, but namespace {ns} already holds 8 GPUs"
            )),
            "{}",
            applied.stderr
        );
    }

    g.gate.stop();
    let applied = g.apply(&nvidia);
    assert!(applied.ok, "workloads are not held up: {}", applied.stderr);
    let refusal = g.wait_event(
        "the ReplicaSet's pods refused while the gate is down",
        &["failed calling webhook", "pods.budget-gate.gpureaper.io"],
        common::cluster::PATIENCE,
    );
    assert_eq!(g.pods("app=nvidia"), 0, "{refusal}");
    let cpu = live_deployment(&ns, "web", "", "");
    let applied = g.apply(&cpu);
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the pod without GPUs", || g.pods("app=web") == 1);
    assert_eq!(g.pods("app=nvidia"), 0);
}

/// What the namespace holds changes after admission: a KAI pod's `gpu-fraction` removed,
/// a suspended Job resumed, a CronJob admitted when the namespace had room running when
/// it has none. Each is refused with one sentence (at `kubectl apply`, or on the CronJob
/// as its run is created), not left to a trickle of quota refusals, and nothing more is
/// held.
#[test]
fn live_kai_shares_resumed_jobs_and_cronjob_runs_are_held_to_the_namespace_total() {
    let g = LiveGate::start("later", "  admission: {largeClaimGpus: 8, mode: Enforce}\n");
    let ns = g.ns.clone();
    // A CronJob whose first run is two to three minutes away, admitted while the
    // namespace holds nothing.
    let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(150);
    let at = at.to_zoned(jiff::tz::TimeZone::UTC);
    let nightly = json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": ns},
        "spec": {"schedule": format!("{} {} * * *", at.minute(), at.hour()), "timeZone": "Etc/UTC",
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "trainer",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}}});
    let applied = g.apply(&nightly.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    // A suspended 8-GPU Job: it holds nothing yet.
    let later = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "later", "namespace": ns},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "trainer",
                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}});
    let applied = g.apply(&later.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    // Half a GPU through KAI, and a 7-GPU server: 7.5 of 8.
    let frac = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "frac", "namespace": ns, "annotations": {"gpu-fraction": "0.5"}},
        "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "main", "image": "x"}]}});
    let applied = g.apply(&frac.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    let applied = g.apply(&live_deployment(&ns, "serve", "nvidia.com/gpu", "7"));
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the server's pod", || g.pods("app=serve") == 1);
    g.wait_refused(
        "the gate counts the server and the KAI pod",
        &live_deployment(&ns, "one", "nvidia.com/gpu", "1"),
    );

    // The share cannot be edited away.
    let edited = g.dev(&["annotate", "pod", "frac", "-n", &ns, "gpu-fraction-"], "");
    assert!(!edited.ok, "{}", edited.stdout);
    assert!(
        edited.stderr.contains(&format!(
            "Pod {ns}/frac may not change its \"gpu-fraction\" annotation after it is created"
        )),
        "{}",
        edited.stderr
    );
    // Resuming the Job claims its 8 GPUs again.
    let resumed = g.dev(
        &[
            "patch",
            "job",
            "later",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"suspend":false}}"#,
        ],
        "",
    );
    assert!(!resumed.ok, "{}", resumed.stdout);
    assert!(
        resumed
            .stderr
            .contains(&format!("denied the request: Job {ns}/later claims 8 GPUs")),
        "{}",
        resumed.stderr
    );
    // The CronJob's run (at most 150 s after it was created) is refused on the CronJob,
    // with the sentence.
    let refusal = g.wait_event(
        "the CronJob's run refused",
        &[
            "which CronJob nightly creates, claims 8 GPUs",
            &format!("namespace {ns} already holds 7.50 GPUs"),
        ],
        std::time::Duration::from_secs(150) + common::cluster::PATIENCE,
    );
    assert!(
        g.cluster.list("jobs", &ns, None).len() == 1,
        "only the suspended Job: {refusal}"
    );
    assert_eq!(g.pods("app=serve") + g.pods("job-name=later"), 1);
}

/// G3 was checked per claim: one 8-GPU claim was refused as over the month's budget, two
/// 4-GPU claims back to back were admitted (178 % of it). What the namespace holds now
/// counts until the month ends.
#[test]
fn live_two_claims_back_to_back_never_cross_the_months_budget() {
    let now = jiff::Timestamp::now();
    let hours_left = gpu_reaper::admission::budget::hours_until(
        now,
        gpu_reaper::admission::budget::month_end(now),
    );
    // 1 USD a GPU-hour: the budget pays for 6.5 GPUs from now to the month's end.
    let budget = (6.5 * hours_left).round();
    let g = LiveGate::start(
        "budget",
        &format!(
            "  cost: {{defaultHourlyUsd: 1}}\n  admission: {{largeClaimGpus: 8, mode: Enforce, monthlyBudgetUsd: {budget}}}\n"
        ),
    );
    let ns = g.ns.clone();
    let first = live_deployment(&ns, "first", "nvidia.com/gpu", "4");
    let applied = g.apply(&first);
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the first claim's pod", || g.pods("app=first") == 1);
    let second = live_deployment(&ns, "second", "nvidia.com/gpu", "4");
    g.wait_refused("the gate counts the first claim", &second);
    let applied = g.apply(&second);
    assert!(!applied.ok, "{}", applied.stdout);
    assert!(
        applied.stderr.contains(&format!(
            "Deployment {ns}/second claims 4 GPUs, which would cost about"
        )) && applied
            .stderr
            .contains("and the 4 GPUs it holds now will cost about"),
        "{}",
        applied.stderr
    );
    assert_eq!(g.pods("app=second"), 0);
}

/// A ResourceClaimTemplate created after the workload that names it was counted as
/// nothing: the workload was admitted with a warning, and the claims the template made
/// later were a listed controller's writes, never checked. Now the template is counted
/// as a claim when it is created, and each claim the ResourceClaim controller makes from
/// it is held to the namespace's total. (The controller's own request is made here with
/// its identity, `kubectl --as`, so the test does not depend on when its retries run.)
#[test]
fn live_a_claim_template_created_after_its_workload_is_counted_when_its_claims_are_made() {
    let g = LiveGate::start("late", "  admission: {largeClaimGpus: 8, mode: Enforce}\n");
    let ns = g.ns.clone();
    let applied = g.apply(&live_deployment(&ns, "serve", "nvidia.com/gpu", "8"));
    assert!(applied.ok, "{}", applied.stderr);
    common::cluster::wait_until("the server's pod", || g.pods("app=serve") == 1);
    g.wait_refused(
        "the gate counts the server",
        &live_deployment(&ns, "one", "nvidia.com/gpu", "1"),
    );
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "late", "namespace": ns},
        "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight"}],
            "containers": [{"name": "main", "image": "trainer", "resources": {"claims": [{"name": "gpus"}]}}]}});
    let applied = g.apply(&pod.to_string());
    assert!(applied.ok, "{}", applied.stderr);
    assert!(
        applied.stderr.contains("ResourceClaimTemplate eight"),
        "a warning names the unknown template: {}",
        applied.stderr
    );
    let devices = json!({"requests": [{"name": "gpus",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 8}}]});
    let template = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "eight", "namespace": ns},
        "spec": {"spec": {"devices": devices}}});
    let applied = g.apply(&template.to_string());
    assert!(!applied.ok, "{}", applied.stdout);
    assert!(
        applied.stderr.contains(&format!(
            "ResourceClaimTemplate {ns}/eight claims 8 GPUs, but namespace {ns} already holds 8 GPUs"
        )),
        "{}",
        applied.stderr
    );
    // The claim the ResourceClaim controller makes for the pod from such a template.
    let uid = g.cluster.get("pod", Some(&ns), "late").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"generateName": "late-gpus-", "namespace": ns,
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "late", "uid": uid,
                "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"devices": devices}});
    let made = g.cluster.try_kubectl(
        &[
            "--as=system:serviceaccount:kube-system:resource-claim-controller",
            "create",
            "-f",
            "-",
        ],
        Some(&claim.to_string()),
    );
    assert!(!made.ok, "{}", made.stdout);
    assert!(
        made.stderr.contains("pods.budget-gate.gpureaper.io")
            && made.stderr.contains(&format!(
                ", which Pod late creates, claims 8 GPUs, but namespace {ns} already holds 8 GPUs and may hold 8"
            )),
        "{}",
        made.stderr
    );
    assert!(g.cluster.list("resourceclaims", &ns, None).is_empty());
}
